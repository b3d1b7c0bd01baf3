//! Being told when a lock is lost: `wait_lost` and `on_lost`, on guards
//! that the client's one watchdog keeps; callbacks that block, panic,
//! drop a guard or unlock one cannot stall the other guards; and a
//! callback queued behind a slow one never runs once its guard is unlocked.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{builder, builder_over, cluster, wait_until};
use redlock_sync::{LockError, LockGuard, Redlock};
use redlock_sync_testing::{Cluster, Fault};

const TTL: Duration = Duration::from_secs(1);

/// Puts another holder's token on every node under `resource`: the
/// guard's next extension is refused.
fn take_over(nodes: &Cluster, resource: &str) {
    for node in nodes.nodes() {
        node.set(resource, "someone-else").unwrap();
    }
}

/// A callback that sends when it ran, and the receiving end.
fn timed_callback() -> (
    impl FnOnce(&LockError) + Send,
    mpsc::Receiver<(Instant, String)>,
) {
    let (tx, rx) = mpsc::channel();
    (
        move |e: &LockError| drop(tx.send((Instant::now(), e.to_string()))),
        rx,
    )
}

fn lock(locks: &Redlock, resource: &str) -> LockGuard {
    locks.lock(resource, TTL).expect("the lock is free")
}

#[test]
fn a_guard_whose_keys_are_taken_over_is_told_at_its_next_extension_and_the_others_are_not() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let (lost, other) = (lock(&locks, "taken"), lock(&locks, "kept"));
    let (callback, told) = timed_callback();
    lost.on_lost(callback);
    let start = Instant::now();
    take_over(&nodes, "taken");

    // Due once a third of the validity is left, then one round.
    assert!(
        lost.wait_lost(2 * TTL),
        "the loss was not told within 2 TTLs"
    );
    let seen = start.elapsed();
    assert!(seen <= TTL, "told after {seen:?}");
    let (at, error) = told.recv_timeout(TTL).expect("the callback ran");
    assert!(
        at.duration_since(start) <= TTL,
        "callback after {:?}",
        at - start
    );
    assert!(error.contains("taken"), "{error}");
    assert!(matches!(lost.check(), Err(LockError::Lost { .. })));

    assert!(!other.wait_lost(2 * TTL), "the other guard was lost");
    assert!(other.is_held());
    assert!(matches!(lost.unlock(), Err(LockError::Lost { .. })));
    other.unlock().expect("the other guard held throughout");
}

#[test]
fn a_partitioned_guard_is_told_once_its_validity_runs_out_within_one_retry() {
    let nodes = cluster(3);
    let proxies = nodes.proxies().unwrap();
    let urls = proxies.iter().map(|p| p.url()).collect();
    let locks = builder_over(urls).build().unwrap();
    let started = Instant::now();
    let result = locks.with_lock("cut-off", TTL, |guard| {
        let (callback, told) = timed_callback();
        guard.on_lost(callback);
        let valid_until = Instant::now() + guard.validity();
        for proxy in &proxies[..2] {
            proxy.set_fault(Fault::Partition);
        }
        assert!(guard.wait_lost(3 * TTL), "the loss was not told");
        // One retry: the client's pause (10 to 20 ms) and a round, which
        // may connect the partitioned nodes anew (connect_timeout) before
        // it reads (io_timeout): 500 ms each.
        let retry = Duration::from_millis(20) + Duration::from_millis(1000);
        assert!(
            Instant::now() <= valid_until + retry,
            "told {:?} late",
            Instant::now() - valid_until
        );
        let (at, _) = told.recv_timeout(TTL).expect("the callback ran");
        assert!(
            at <= valid_until + retry,
            "callback {:?} late",
            at - valid_until
        );
        guard.check()
    });
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(started.elapsed() < 5 * TTL);
}

#[test]
fn a_callback_registered_after_the_loss_runs_at_once_and_one_registered_on_a_released_guard_never()
{
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let guard = lock(&locks, "late");
    take_over(&nodes, "late");
    assert!(guard.wait_lost(2 * TTL));
    let (callback, told) = timed_callback();
    guard.on_lost(callback);
    told.recv_timeout(TTL).expect("the late callback ran");

    let released = lock(&locks, "released");
    let (callback, told) = timed_callback();
    released.on_lost(callback);
    released.unlock().unwrap();
    assert!(
        told.recv_timeout(2 * TTL).is_err(),
        "a released guard's callback ran"
    );
}

#[test]
fn callbacks_that_block_panic_drop_or_unlock_guards_do_not_stall_the_other_guards() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let steady = lock(&locks, "steady");
    let (dropped, unlocked) = (lock(&locks, "dropped"), lock(&locks, "unlocked"));
    let (unblock, blocked) = mpsc::channel::<()>();
    let (ran, runs) = mpsc::channel();

    let panicking = lock(&locks, "panics");
    let tell = ran.clone();
    panicking.on_lost(move |_| {
        tell.send("panics").unwrap();
        panic!("a callback that panics");
    });
    let blocking = lock(&locks, "blocks");
    let tell = ran.clone();
    blocking.on_lost(move |_| {
        tell.send("blocks").unwrap();
        let _ = blocked.recv_timeout(Duration::from_secs(10));
    });
    let dropping = lock(&locks, "drops");
    let tell = ran.clone();
    dropping.on_lost(move |_| {
        drop(dropped);
        tell.send("drops").unwrap();
    });
    let unlocking = lock(&locks, "unlocks");
    unlocking.on_lost(move |_| {
        let _ = unlocked.unlock();
        ran.send("unlocks").unwrap();
    });
    for resource in ["panics", "blocks", "drops", "unlocks"] {
        take_over(&nodes, resource);
    }

    // The panic is caught, and the blocking callback runs; the others wait
    // behind it, but every extension goes on.
    // (Roomy bounds: the panic's report may take a busy machine a while.)
    let mut order = vec![];
    while let Ok(name) = runs.recv_timeout(10 * TTL) {
        order.push(name);
        if name == "blocks" {
            break;
        }
    }
    assert!(order.contains(&"blocks"), "ran: {order:?}");
    let start = Instant::now();
    while start.elapsed() < 3 * TTL {
        assert!(
            steady.is_held(),
            "the steady guard was lost while a callback blocked"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unblock.send(()).unwrap();
    wait_until(2 * TTL, "every callback ran", || {
        order.extend(runs.try_iter());
        order.len() == 4
    });
    // The guards the callbacks dropped and unlocked were released.
    wait_until(
        2 * TTL,
        "the dropped and unlocked guards' keys are gone",
        || {
            nodes.nodes().iter().all(|n| {
                n.get("dropped").unwrap().is_none() && n.get("unlocked").unwrap().is_none()
            })
        },
    );
    steady.unlock().expect("held throughout");
}

#[test]
fn a_callback_queued_behind_a_slow_one_never_runs_once_its_guard_was_unlocked() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let (slow, unlocked, sentinel) = (lock(&locks, "slow"), lock(&locks, "b"), lock(&locks, "d"));
    let (started, slow_started) = mpsc::channel();
    let (finish, finished) = mpsc::channel::<()>();
    slow.on_lost(move |_| {
        started.send(()).unwrap();
        let _ = finished.recv_timeout(Duration::from_secs(10));
    });
    let (ran, runs) = mpsc::channel();
    let tell = ran.clone();
    unlocked.on_lost(move |_| tell.send("b").unwrap());
    sentinel.on_lost(move |_| ran.send("d").unwrap());

    // The slow callback runs; B's loss is told and its callback queued
    // behind it; then D's, queued after B's (told in a later round).
    take_over(&nodes, "slow");
    slow_started
        .recv_timeout(3 * TTL)
        .expect("the slow callback started");
    take_over(&nodes, "b");
    assert!(unlocked.wait_lost(3 * TTL), "B was not lost");
    take_over(&nodes, "d");
    assert!(sentinel.wait_lost(3 * TTL), "D was not lost");
    // B is unlocked while its callback waits: it must never run.
    let start = Instant::now();
    assert!(matches!(unlocked.unlock(), Err(LockError::Lost { .. })));
    assert!(start.elapsed() < TTL, "unlock took {:?}", start.elapsed());
    finish.send(()).unwrap();
    // D's callback ran, so B's turn has passed: B's was dropped unrun
    // (every sender goes, once D's callback returns).
    assert_eq!(runs.recv_timeout(3 * TTL), Ok("d"));
    wait_until(TTL, "B's callback is dropped", || match runs.try_recv() {
        Ok(name) => panic!("{name}'s callback ran"),
        Err(e) => e == mpsc::TryRecvError::Disconnected,
    });
    drop((slow, sentinel));
}
