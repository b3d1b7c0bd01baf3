//! The time bound of a process that starts clusters: past it, the process
//! stops its servers and exits, naming the tests whose clusters are up, so
//! that a test that hangs fails instead of holding CI (see the crate docs,
//! "A time bound for every test binary").
//!
//! The first cluster the process starts arms one thread that sleeps out the
//! bound. Every cluster registers while it is up, with the name of the
//! thread that started it: the test harness names each test's thread after
//! the test.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::{io_error, lock, record, HarnessError};

/// The environment variable that sets the bound, in seconds (`0`: none).
pub const TIME_BOUND_VAR: &str = "REDLOCK_SYNC_TEST_TIMEOUT";
/// The bound when [`TIME_BOUND_VAR`] is not set.
pub const DEFAULT_TIME_BOUND: Duration = Duration::from_secs(300);
/// The exit status of a process stopped by its bound (as `timeout(1)`'s).
pub const TIMED_OUT_STATUS: i32 = 124;

/// The clusters that are up: who started each, when, with how many nodes.
static LIVE: Mutex<BTreeMap<u64, Started>> = Mutex::new(BTreeMap::new());
/// The bound this process runs under, read once; `None` for no bound.
static BOUND: OnceLock<Option<Duration>> = OnceLock::new();

struct Started {
    by: String,
    at: Instant,
    nodes: usize,
}

/// A cluster's place among the live ones; dropping it removes the cluster.
#[derive(Debug)]
pub(super) struct Watch(u64);

impl Drop for Watch {
    fn drop(&mut self) {
        lock(&LIVE).remove(&self.0);
    }
}

/// Arms the bound (first call of the process) and registers a cluster of
/// `nodes` nodes that the current thread starts.
///
/// # Errors
///
/// [`HarnessError::Io`] if [`TIME_BOUND_VAR`] is not a number of seconds.
pub(super) fn watch(nodes: usize) -> Result<Watch, HarnessError> {
    if BOUND.get().is_none() {
        let bound = bound_from(std::env::var(TIME_BOUND_VAR).ok().as_deref())?;
        // Of two first clusters at once, one arms it.
        if BOUND.set(bound).is_ok() {
            if let Some(bound) = bound {
                thread::Builder::new()
                    .name("redlock-sync-testing time bound".into())
                    .spawn(move || expire(bound))
                    .map_err(|e| io_error("starting the time bound's thread", e))?;
            }
        }
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let by = match thread::current().name() {
        Some(name) => format!("`{name}`"),
        None => "an unnamed thread".to_string(),
    };
    let started = Started {
        by,
        at: Instant::now(),
        nodes,
    };
    lock(&LIVE).insert(id, started);
    Ok(Watch(id))
}

/// The bound [`TIME_BOUND_VAR`]'s value sets: seconds, fractions allowed.
fn bound_from(value: Option<&str>) -> Result<Option<Duration>, HarnessError> {
    let Some(value) = value else {
        return Ok(Some(DEFAULT_TIME_BOUND));
    };
    match value
        .trim()
        .parse::<f64>()
        .ok()
        .map(Duration::try_from_secs_f64)
    {
        Some(Ok(bound)) if bound.is_zero() => Ok(None),
        Some(Ok(bound)) => Ok(Some(bound)),
        _ => Err(io_error(
            format!("reading {TIME_BOUND_VAR}={value:?}"),
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "expected the test binary's time bound in seconds, such as 300, or 0 for none",
            ),
        )),
    }
}

/// Sleeps out the bound, then stops every server of the process and exits.
fn expire(bound: Duration) {
    thread::sleep(bound);
    let now = Instant::now();
    let live: Vec<String> = lock(&LIVE)
        .values()
        .map(|c| {
            format!(
                "\n  a cluster of {} node(s) started {:.0?} ago by {}",
                c.nodes,
                now.duration_since(c.at),
                c.by
            )
        })
        .collect();
    let running = if live.is_empty() {
        " No cluster is up: the test that hangs holds none.".to_string()
    } else {
        format!(
            " Still up (the test that hangs is among these):{}",
            live.concat()
        )
    };
    // Straight to the process's stderr: the test harness captures what
    // `eprintln!` prints from a test's threads, and would drop it on exit.
    let _ = writeln!(
        io::stderr(),
        "\nredlock-sync-testing: this process ran past its time bound of {bound:?} \
         since its first cluster started ({TIME_BOUND_VAR}, in seconds; 0 for no bound): \
         a test hangs.{running}\nStopping every server this process started and exiting \
         with status {TIMED_OUT_STATUS}."
    );
    record::reap_own();
    std::process::exit(TIMED_OUT_STATUS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_read_in_seconds_and_zero_turns_it_off() {
        assert_eq!(bound_from(None).unwrap(), Some(DEFAULT_TIME_BOUND));
        assert_eq!(
            bound_from(Some("2.5")).unwrap(),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            bound_from(Some(" 600 ")).unwrap(),
            Some(Duration::from_secs(600))
        );
        assert_eq!(bound_from(Some("0")).unwrap(), None);
        for bad in ["", "five", "-1", "inf", "NaN"] {
            let err = bound_from(Some(bad)).unwrap_err().to_string();
            assert!(
                err.contains(TIME_BOUND_VAR) && err.contains("seconds"),
                "{err}"
            );
        }
    }
}
