//! A leader: waits for ever for the leader lock, leads while it holds it,
//! and on Ctrl-C (or SIGTERM) stops waiting, or steps down, at once.
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
    let options = LockOptions::new(Duration::from_secs(10))
        .patience(Patience::Forever)
        .cancel(&shutdown);
    println!("waiting to lead (Ctrl-C stops waiting)");
    let guard = match locks.lock("leader", options) {
        Ok(guard) => guard,
        Err(LockError::Cancelled { .. }) => {
            println!("stopped waiting: never led");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("leading with lock {} (Ctrl-C steps down)", guard.token());
    // The guard's watchdog keeps the lock while we lead; the lead ends on
    // shutdown, or if the lock is lost.
    let mut term = 0;
    while !shutdown.is_cancelled() {
        guard.check()?;
        term += 1;
        println!("term {term}: doing the leader's work");
        std::thread::sleep(Duration::from_secs(1));
    }
    guard.unlock()?;
    println!("stepped down");
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
