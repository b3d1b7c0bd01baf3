//! Events for logs and metrics: counters per kind of event, and each event
//! printed with `eprintln!` (where an application would hand it to `log` or
//! `tracing`); then a contended lock, a guard kept alive, and its loss.
//!
//! Run it with `cargo run --example events`. It starts three throwaway
//! local redis-server nodes itself (redis-server must be installed), unless
//! `REDLOCK_NODES` names real ones, comma-separated.

mod common;

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_sync::{Event, LockOptions, Redlock, RetryPolicy, What};

fn main() -> ExitCode {
    common::exit_code(run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let (_cluster, urls) = common::nodes(3)?;
    // Counters by kind of event: a metrics library would keep these.
    let counts: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let count = Arc::clone(&counts);
    let locks = Redlock::builder(&urls)
        .retry_policy(RetryPolicy::default().delay(Duration::from_millis(20)))
        .observer(move |event: &Event<'_>| {
            *count
                .lock()
                .unwrap()
                .entry(format!("{:?}", event.what))
                .or_default() += 1;
            // Quick and non-blocking: the observer runs inline.
            match event.what {
                What::NodeFailed => eprintln!(
                    "warn: {} on {}: {:?}",
                    event.resource,
                    event.node.unwrap_or("?"),
                    event.node_outcome
                ),
                what => eprintln!(
                    "debug: {what:?} {} token {}… attempt {} in {:?}",
                    event.resource, event.token, event.attempt, event.elapsed
                ),
            }
        })
        .build()?;

    // Contended: another client holds the lock for a moment.
    let other = Redlock::new(&urls)?;
    let held = other.acquire("report", Duration::from_secs(5))?;
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        other.release(held)
    });
    let lock = locks.acquire("report", Duration::from_secs(5))?;
    releaser.join().expect("the releasing thread")?;
    locks.release(lock)?;

    // A guard kept alive past its TTL, up to its hold cap, where the lock
    // runs out: a loss, told to `on_lost` and to `wait_lost`.
    let capped = LockOptions::new(Duration::from_millis(300)).max_hold(Duration::from_millis(800));
    let guard = locks.lock("nightly", capped)?;
    guard.on_lost(|e| eprintln!("told on the notifier thread: {e}"));
    println!("nightly: {:?}", locks.inspect("nightly")?.verdict());
    let lost = guard.wait_lost(Duration::from_secs(2));
    println!("nightly lost: {lost}");
    drop(guard);

    println!("events: {:?}", counts.lock().unwrap());
    Ok(())
}
