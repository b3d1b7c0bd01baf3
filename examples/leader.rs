//! A leader: waits for ever for the leader lock, leads while it holds it,
//! and on Ctrl-C (or SIGTERM) stops waiting, or steps down, at once.
//!
//! It extends the lock on its own schedule: once a term, one round each
//! (`Patience::Retries(0)`). While most nodes are down, a term then waits
//! one `io_timeout` at most, not the retry policy's pauses. A guard
//! (`Redlock::lock`) would extend it on the watchdog instead.
//!
//! Run it with `cargo run --example leader`, in several terminals against
//! the same nodes to see one lead and the others wait:
//!
//! ```text
//! REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379 \
//!     cargo run --example leader
//! ```
//!
//! Without `REDLOCK_NODES` it starts three throwaway local redis-server
//! nodes, and a rival that holds the lock for the first three seconds, so
//! that this leader is seen waiting first.

mod common;

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

/// The lock's TTL: how long another leader waits after this one vanished.
const TTL: Duration = Duration::from_secs(10);

/// One term of the leader's work.
const TERM: Duration = Duration::from_secs(1);

use redlock_sync::{Cancel, LockError, LockOptions, Patience, Redlock};

fn main() -> ExitCode {
    common::exit_code(run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let (cluster, urls) = common::nodes(3)?;
    let locks = Redlock::new(&urls)?;
    let shutdown = Cancel::new();
    stop_on_signals(&shutdown)?;

    if cluster.is_some() {
        let rival = locks.acquire("leader", Duration::from_secs(3))?;
        println!("a rival leads for 3 s (lock {})", rival.token());
    }

    // Wait for ever: only the lock, or the shutdown, ends the wait. A
    // release by the rival wakes this waiter at once.
    let options = LockOptions::new(TTL)
        .patience(Patience::Forever)
        .cancel(&shutdown);
    println!("waiting to lead (Ctrl-C stops waiting)");
    let mut lock = match locks.acquire("leader", options) {
        Ok(lock) => lock,
        Err(LockError::Cancelled { .. }) => {
            println!("stopped waiting: never led");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("leading with lock {} (Ctrl-C steps down)", lock.token());
    // Each term ends with one extension round. The lead ends on shutdown,
    // or when too little validity is left for another term.
    let once = LockOptions::new(TTL).patience(Patience::Retries(0));
    let mut term = 0;
    while !shutdown.is_cancelled() && lock.validity() > 2 * TERM {
        term += 1;
        println!("term {term}: doing the leader's work");
        std::thread::sleep(TERM);
        match locks.extend(&mut lock, &once) {
            Ok(()) => {}
            // Too few nodes answered: lead on while the validity lasts.
            Err(e @ LockError::NoQuorum { .. }) => println!("term {term}: {e}"),
            Err(e) => {
                let _ = locks.release(lock);
                return Err(e.into());
            }
        }
    }
    let why = match shutdown.is_cancelled() {
        true => "on shutdown",
        false => "too little validity left for a term",
    };
    locks.release(lock)?;
    println!("stepped down: {why}");
    Ok(())
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM.
#[cfg(unix)]
fn stop_on_signals(shutdown: &Cancel) -> Result<(), Box<dyn Error>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let shutdown = shutdown.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            shutdown.cancel();
        }
    });
    Ok(())
}

/// Signals are not caught here: stop the process to stop waiting.
#[cfg(not(unix))]
fn stop_on_signals(_: &Cancel) -> Result<(), Box<dyn Error>> {
    Ok(())
}
