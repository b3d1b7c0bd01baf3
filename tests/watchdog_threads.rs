//! One watchdog per client: a thousand guards on one client cost two
//! threads (the watchdog and the notifier), are all extended past three
//! TTLs while a node is stopped part of the time, and are all released
//! when dropped. In a test binary of its own: it counts the process's
//! threads.

mod common;

use std::time::{Duration, Instant};

use common::{builder, cluster, wait_until};

use redlock_sync::LockOptions;

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

#[test]
fn a_thousand_guards_on_one_client_take_two_threads_and_all_outlive_three_ttls_while_a_node_is_stopped(
) {
    const GUARDS: usize = 1_000;
    let started = Instant::now();
    let nodes = cluster(3);
    // A round (connect_timeout + io_timeout) well inside the third of
    // the TTL that is left when an extension falls due.
    let round = Duration::from_millis(200);
    let locks = (builder(&nodes).io_timeout(round).connect_timeout(round))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(3);
    let before = threads();

    let guards: Vec<_> = (0..GUARDS)
        .map(|i| {
            let guard = locks.lock(format!("many:{i}"), LockOptions::new(ttl));
            guard.unwrap_or_else(|e| panic!("guard {i}: {e}"))
        })
        .collect();
    let acquired = Instant::now();
    // The most threads seen while every node answers, and overall.
    let (mut most_healthy, mut most) = (threads(), threads());
    // Three TTLs, with node 2 stopped for the middle one.
    let mut stopped = false;
    while acquired.elapsed() < 3 * ttl + ttl / 2 {
        if !stopped && acquired.elapsed() >= ttl {
            nodes.node(2).pause().unwrap();
            stopped = true;
        }
        if stopped && nodes.node(2).is_paused() && acquired.elapsed() >= 2 * ttl {
            nodes.node(2).resume().unwrap();
        }
        let now = threads();
        most = most.max(now);
        if !stopped {
            most_healthy = most_healthy.max(now);
        }
        if let Some(lost) = guards.iter().find(|g| !g.is_held()) {
            panic!(
                "{} lost after {:?}: {:?}",
                lost.resource(),
                acquired.elapsed(),
                lost.check()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("threads: {before} before, {most_healthy} at most while every node answered, {most} at most");
    assert!(
        most_healthy <= before + 2,
        "{most_healthy} threads with {GUARDS} guards, {before} before: expected at most 2 more"
    );
    // While rounds are slow, the watchdog runs due extensions side by side
    // on up to 3 short-lived helpers.
    assert!(
        most <= before + 2 + 3,
        "{most} threads with {GUARDS} guards and a stopped node, {before} before"
    );
    assert!(
        guards.iter().all(|g| g.validity() > ttl / 4),
        "every guard is still being extended"
    );

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
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}
