//! One watchdog per client: a thousand guards on one client cost at most
//! two threads (the watchdog and the notifier), however slow a node is,
//! are all extended past three TTLs while a node is stopped part of the
//! time, and are all released when dropped. In a test binary of its own:
//! it counts the process's threads.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{builder, cluster, wait_until};

use redlock_sync::{LockGuard, LockOptions, What};

const GUARDS: usize = 1_000;

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

/// The names of this process's threads, for a failure message.
fn names() -> Vec<String> {
    let tasks = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten();
    let name = |task: std::fs::DirEntry| std::fs::read_to_string(task.path().join("comm"));
    tasks
        .filter_map(|task| name(task).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// How many times the watchdog extended each guard, as the observer
/// counts them.
fn counts(extended: &[AtomicUsize]) -> Vec<usize> {
    extended.iter().map(|n| n.load(Ordering::Relaxed)).collect()
}

/// Watches the guards and the process's threads while waiting for `cond`,
/// every few milliseconds for at most `limit`: fails at once if a guard is
/// lost or more than `most` threads run. Returns the most threads seen.
fn watch_until(
    guards: &[LockGuard],
    most: usize,
    limit: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
) -> usize {
    let (start, mut seen) = (Instant::now(), 0);
    loop {
        let now = threads();
        assert!(
            now <= most,
            "{now} threads while {what}, at most {most}: {:?}",
            names()
        );
        seen = seen.max(now);
        if let Some(lost) = guards.iter().find(|g| !g.is_held()) {
            panic!("{} lost while {what}: {:?}", lost.resource(), lost.check());
        }
        if cond() {
            return seen;
        }
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_thousand_guards_on_one_client_take_at_most_two_threads_and_all_outlive_three_ttls_while_a_node_is_stopped(
) {
    let started = Instant::now();
    let nodes = cluster(3);
    // Extensions fall due with half the TTL left; a round (connect_timeout
    // + io_timeout, 1 s) fits in it with room for a retry.
    let ttl = Duration::from_secs(4);
    let extended: Arc<Vec<AtomicUsize>> =
        Arc::new((0..GUARDS).map(|_| AtomicUsize::new(0)).collect());
    let lost = Arc::new(AtomicUsize::new(0));
    let (count, losses) = (Arc::clone(&extended), Arc::clone(&lost));
    let locks = builder(&nodes)
        .extend_when_left(0.5)
        .observer(move |event| {
            let guard = (event.resource.strip_prefix("many:")).and_then(|i| i.parse().ok());
            match (event.what, guard.and_then(|i: usize| count.get(i))) {
                (What::Extended, Some(n)) => drop(n.fetch_add(1, Ordering::Relaxed)),
                (What::Lost, _) => drop(losses.fetch_add(1, Ordering::Relaxed)),
                _ => {}
            }
        })
        .build()
        .unwrap();
    // Every node connected: the callers' rounds start no connect threads
    // from here on.
    locks
        .release(locks.acquire("warm-up", ttl).unwrap())
        .unwrap();
    let before = threads();
    let most = before + 2;
    // Whether every guard was extended at least as often as `goal` says.
    let reached = |goal: &[usize]| {
        counts(&extended)
            .iter()
            .zip(goal)
            .all(|(n, goal)| n >= goal)
    };

    let mut guards = Vec::with_capacity(GUARDS);
    for i in 0..GUARDS {
        let guard = locks.lock(format!("many:{i}"), LockOptions::new(ttl));
        guards.push(guard.unwrap_or_else(|e| panic!("guard {i}: {e}")));
        let now = threads();
        let guards = i + 1;
        assert!(
            now <= most,
            "{now} threads with {guards} guards, at most {most}: {:?}",
            names()
        );
    }
    let acquired = Instant::now();
    let limit = 3 * ttl;

    // Every node answers: each guard is extended once.
    let once = vec![1; GUARDS];
    let mut seen = watch_until(&guards, most, limit, "each guard is extended", || {
        reached(&once)
    });

    // Node 2 stops: each guard is extended twice more without it.
    nodes.node(2).pause().unwrap();
    let twice: Vec<_> = counts(&extended).iter().map(|n| n + 2).collect();
    let stopped = "each guard is extended twice with node 2 stopped";
    seen = seen.max(watch_until(&guards, most, 2 * limit, stopped, || {
        reached(&twice)
    }));

    // Node 2 answers again: each guard is extended once more, and held
    // for three TTLs.
    nodes.node(2).resume().unwrap();
    let again: Vec<_> = counts(&extended).iter().map(|n| n + 1).collect();
    let past = "each guard is extended again with node 2 back, past three TTLs";
    seen = seen.max(watch_until(&guards, most, 2 * limit, past, || {
        reached(&again) && acquired.elapsed() > 3 * ttl
    }));
    assert_eq!(lost.load(Ordering::Relaxed), 0, "no guard was told lost");
    eprintln!("threads: {before} before the guards, at most {seen} with them (limit {most})");

    drop(guards);
    wait_until(Duration::from_secs(10), "every key is released", || {
        nodes
            .nodes()
            .iter()
            .all(|n| n.keys().is_ok_and(|k| k.is_empty()))
    });
    // The watchdog holds the client weakly: dropping it ends the thread.
    drop(locks);
    wait_until(
        Duration::from_secs(5),
        "the watchdog exits with its client",
        || threads() <= before,
    );
    // Also when its next lease falls due only in a minute (or it idles):
    // the client's drop wakes it, it does not sleep on.
    let locks = builder(&nodes).build().unwrap();
    let guard = (locks.lock("long", LockOptions::new(Duration::from_secs(60)))).unwrap();
    guard.unlock().unwrap();
    drop(locks);
    wait_until(
        Duration::from_secs(5),
        "the watchdog of a client whose lease is due in a minute exits with it",
        || threads() <= before,
    );
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "took {:?}",
        started.elapsed()
    );
}
