//! User code that the client runs for its guards is fenced off per lock:
//! a retry policy's backoff that panics on the watchdog ends only the
//! guard whose turn it was (told, with an error that names the cause, and
//! released), never the other guards of its round, and no unlock hangs;
//! the watchdog never asks the backoff past the retry count; an observer
//! and callbacks that panic change no lock.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{builder, cluster, wait_until};
use redlock_sync::{Event, LockError, LockGuard, LockOptions, RetryPolicy, What};
use redlock_sync_testing::Cluster;

/// What the observer saw: each event's kind, resource, failed rounds and
/// the round's time (the same for every guard of one round).
type Seen = Arc<Mutex<Vec<(What, String, u32, Duration)>>>;

fn recorder(seen: &Seen) -> impl Fn(&Event<'_>) + Send + Sync + 'static {
    let seen = Arc::clone(seen);
    move |event: &Event<'_>| {
        let told = (event.what, event.resource.to_string(), event.failures);
        seen.lock()
            .unwrap()
            .push((told.0, told.1, told.2, event.elapsed));
    }
}

/// The events of `what` seen from position `from` on, by resource.
fn told(seen: &Seen, from: usize, what: What) -> Vec<(String, u32, Duration)> {
    let seen = seen.lock().unwrap();
    (seen[from..].iter())
        .filter(|(w, ..)| *w == what)
        .map(|(_, r, n, d)| (r.clone(), *n, *d))
        .collect()
}

/// Stops nodes 1 and 2 of three: no quorum until [`resume`].
fn pause(nodes: &Cluster) {
    nodes.node(1).pause().unwrap();
    nodes.node(2).pause().unwrap();
}

fn resume(nodes: &Cluster) {
    nodes.node(1).resume().unwrap();
    nodes.node(2).resume().unwrap();
}

/// Unlocks `guard`, which must return within one round (with room for a
/// busy machine); returns how it went.
fn unlock_promptly(guard: LockGuard) -> Result<(), LockError> {
    let (resource, start) = (guard.resource().to_string(), Instant::now());
    let unlocked = guard.unlock().map(drop);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "unlock of {resource} took {took:?}"
    );
    unlocked
}

#[test]
fn a_backoff_that_panics_on_the_watchdog_ends_only_the_guard_whose_turn_it_was() {
    let started = Instant::now();
    let nodes = cluster(3);
    // The second pause the watchdog asks for panics: a turn in the round
    // that extends the guards that fell due while the first guard's
    // failed round ran (one round for all of them).
    let calls = Arc::new(AtomicU32::new(0));
    let count = Arc::clone(&calls);
    let policy = RetryPolicy::default().retries(3).backoff(move |n| {
        if count.fetch_add(1, Ordering::SeqCst) == 1 {
            panic!("no pause planned for attempt {n}");
        }
        Duration::from_millis(20)
    });
    let seen: Seen = Arc::default();
    let locks = builder(&nodes)
        .retry_policy(policy)
        .extend_when_left(0.9)
        .observer(recorder(&seen))
        .build()
        .unwrap();
    let (told_tx, told_rx) = mpsc::channel();
    let options = LockOptions::new(Duration::from_secs(6));
    let guards: Vec<LockGuard> = (0..5)
        .map(|i| {
            let guard = locks.lock(format!("batch:{i}"), options.clone()).unwrap();
            let tell = told_tx.clone();
            guard.on_lost(move |e| drop(tell.send((i, e.to_string()))));
            guard
        })
        .collect();
    pause(&nodes);

    // One guard is told, with the panic named.
    let (lost, message) = told_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a guard is told");
    assert!(message.contains("backoff panicked"), "{message}");
    assert!(
        message.contains("no pause planned for attempt"),
        "{message}"
    );
    let resource = format!("batch:{lost}");
    assert!(
        matches!(guards[lost].check(), Err(LockError::Panicked { .. })),
        "{:?}",
        guards[lost].check()
    );
    // It shared its failed round with other guards.
    let failed = told(&seen, 0, What::ExtendFailed);
    let round = failed
        .iter()
        .find(|(r, ..)| *r == resource)
        .map(|(.., d)| *d);
    let round = round.expect("the panicked guard's failed extension");
    let shared = failed
        .iter()
        .filter(|(r, _, d)| *d == round && *r != resource);
    assert!(shared.count() >= 1, "alone in its round: {failed:?}");
    // It was released where a node answers, and the others were not.
    wait_until(
        Duration::from_secs(5),
        "the panicked guard's key is gone",
        || nodes.node(0).get(&resource).unwrap().is_none(),
    );
    for (i, guard) in guards.iter().enumerate().filter(|(i, _)| *i != lost) {
        assert!(guard.is_held(), "batch:{i} was lost");
        assert!(nodes.node(0).get(guard.resource()).unwrap().is_some());
    }

    // Every other guard is extended again once the nodes answer.
    let from = seen.lock().unwrap().len();
    resume(&nodes);
    wait_until(
        Duration::from_secs(10),
        "the other guards are extended",
        || {
            let extended = told(&seen, from, What::Extended);
            (0..5)
                .filter(|i| *i != lost)
                .all(|i| extended.iter().any(|(r, ..)| *r == format!("batch:{i}")))
        },
    );
    assert!(told_rx.try_recv().is_err(), "another guard was told");
    for (i, guard) in guards.into_iter().enumerate() {
        let unlocked = unlock_promptly(guard);
        match i == lost {
            true => assert!(matches!(unlocked, Err(LockError::Panicked { .. }))),
            false => unlocked.unwrap_or_else(|e| panic!("batch:{i}: {e}")),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn the_watchdog_asks_the_backoff_at_most_for_the_retry_count_and_with_no_retries_never() {
    let started = Instant::now();
    let nodes = cluster(3);
    // A table as long as the retries: attempt 4 would panic.
    const TABLE: [Duration; 3] = [
        Duration::from_millis(10),
        Duration::from_millis(20),
        Duration::from_millis(40),
    ];
    let asked = Arc::new(AtomicU32::new(0));
    let most = Arc::clone(&asked);
    let table = RetryPolicy::default().retries(3).backoff(move |n| {
        most.fetch_max(n, Ordering::SeqCst);
        TABLE[n as usize - 1]
    });
    let never = RetryPolicy::default()
        .retries(0)
        .backoff(|n| panic!("asked for attempt {n}"));
    let seen: Seen = Arc::default();
    let options = LockOptions::new(Duration::from_secs(6));
    let guards: Vec<LockGuard> = [("table", table), ("never", never)]
        .into_iter()
        .map(|(name, policy)| {
            let locks = builder(&nodes)
                .retry_policy(policy)
                .extend_when_left(0.9)
                .observer(recorder(&seen))
                .build()
                .unwrap();
            locks.lock(name, options.clone()).unwrap()
        })
        .collect();

    // Both fail their extensions for a second, then win them again.
    pause(&nodes);
    let from = seen.lock().unwrap().len();
    wait_until(Duration::from_secs(5), "both extensions fail", || {
        told(&seen, from, What::ExtendFailed).len() >= 2
    });
    let outage = Instant::now() + Duration::from_secs(1);
    wait_until(Duration::from_secs(5), "the outage is over", || {
        Instant::now() >= outage && guards.iter().all(LockGuard::is_held)
    });
    resume(&nodes);
    wait_until(
        Duration::from_secs(10),
        "both guards are extended again",
        || {
            let extended = told(&seen, from, What::Extended);
            ["table", "never"]
                .iter()
                .all(|g| extended.iter().any(|(r, ..)| r == g))
        },
    );
    // The table's guard failed more rounds than it has retries, and was
    // asked for no pause past them.
    let extended: HashMap<String, u32> = (told(&seen, from, What::Extended).into_iter())
        .map(|(r, n, _)| (r, n))
        .rev()
        .collect();
    assert!(extended["table"] > 3, "{extended:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 3);
    assert!(told(&seen, 0, What::Lost).is_empty());
    for guard in guards {
        unlock_promptly(guard).expect("held throughout");
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn an_observer_and_callbacks_that_panic_change_no_lock() {
    let started = Instant::now();
    let nodes = cluster(3);
    let locks = builder(&nodes)
        .observer(|_: &Event<'_>| panic!("an observer that panics"))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(2);
    let (steady, panicking, after) = (
        locks.lock("steady", ttl).unwrap(),
        locks.lock("panicking", ttl).unwrap(),
        locks.lock("after", ttl).unwrap(),
    );
    let (ran, runs) = mpsc::channel();
    let tell = ran.clone();
    panicking.on_lost(move |_| {
        tell.send("panicking").unwrap();
        panic!("a callback that panics");
    });
    after.on_lost(move |_| ran.send("after").unwrap());
    for node in nodes.nodes() {
        node.set("panicking", "someone-else").unwrap();
    }
    assert_eq!(runs.recv_timeout(3 * ttl), Ok("panicking"));
    // The notifier goes on after the panic.
    for node in nodes.nodes() {
        node.set("after", "someone-else").unwrap();
    }
    assert_eq!(runs.recv_timeout(3 * ttl), Ok("after"));
    // The steady guard is extended throughout, past two TTLs.
    common::holds_throughout(2 * ttl, "the steady guard holds", || steady.is_held());
    assert!(matches!(
        unlock_promptly(panicking),
        Err(LockError::Lost { .. })
    ));
    assert!(matches!(
        unlock_promptly(after),
        Err(LockError::Lost { .. })
    ));
    unlock_promptly(steady).expect("held throughout");
    // Plain locks too.
    let lock = locks.acquire("plain", ttl).unwrap();
    locks.release(lock).unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
}
