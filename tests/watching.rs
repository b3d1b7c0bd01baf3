//! Being told when a lock is lost: `wait_lost` and `on_lost`, on guards
//! that the client's one watchdog keeps; callbacks that block, panic,
//! drop a guard or unlock one cannot stall the other guards; and a loss
//! is never skipped: `wait_lost`, a drop and an unlock after a loss wait
//! for its callbacks, except within a callback.

mod common;

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{builder, builder_over, cluster, wait_until};
use redlock_sync::{LockError, LockGuard, LockOptions, Redlock};
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
fn an_unlock_after_a_loss_waits_for_its_callback_even_queued_behind_a_slow_one() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let slow = lock(&locks, "slow");
    let unlocked = lock(&locks, "b");
    let (started, slow_started) = mpsc::channel();
    let (finish, finished) = mpsc::channel::<()>();
    slow.on_lost(move |_| {
        started.send(()).unwrap();
        let _ = finished.recv_timeout(Duration::from_secs(10));
    });
    let (ran, runs) = mpsc::channel();
    let tell = ran.clone();
    unlocked.on_lost(move |_| tell.send("callback").unwrap());

    // The slow callback runs; B's loss is told and its callback queued
    // behind it.
    take_over(&nodes, "slow");
    slow_started
        .recv_timeout(3 * TTL)
        .expect("the slow callback started");
    take_over(&nodes, "b");
    wait_until(3 * TTL, "B is lost", || !unlocked.is_held());
    assert!(
        !unlocked.wait_lost(TTL / 5),
        "wait_lost said lost before B's callback ran"
    );
    // B is unlocked while its callback waits: the unlock waits for it.
    let unlocking = std::thread::spawn(move || {
        let result = unlocked.unlock();
        ran.send("unlock returned").unwrap();
        result
    });
    assert!(
        runs.recv_timeout(TTL / 5).is_err(),
        "the unlock or the callback went ahead of the slow callback"
    );
    finish.send(()).unwrap();
    assert_eq!(runs.recv_timeout(3 * TTL), Ok("callback"));
    assert_eq!(runs.recv_timeout(3 * TTL), Ok("unlock returned"));
    let result = unlocking.join().unwrap();
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    drop(slow);
}

/// The options of a guard that is never extended: its lock runs out at
/// the hold cap, about `ttl` after the acquisition.
fn capped(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).max_hold(ttl)
}

#[test]
fn wait_lost_then_an_immediate_drop_runs_the_callback_in_50_of_50_losses() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let ttl = Duration::from_millis(200);
    let started = Instant::now();
    let mut before_return = 0;
    let mut before_drop = 0;
    for run in 0..50 {
        let resource = format!("run:{run}");
        // Every other run, the keys are taken over (an extension is
        // refused); else the lock runs out at its hold cap.
        let taken = run % 2 == 0;
        let options = if taken { ttl.into() } else { capped(ttl) };
        let guard = locks.lock(&resource, options).expect("the lock is free");
        let (callback, told) = timed_callback();
        guard.on_lost(callback);
        if taken {
            take_over(&nodes, &resource);
        }
        assert!(guard.wait_lost(10 * ttl), "run {run}: no loss");
        before_return += usize::from(told.try_recv().is_ok());
        drop(guard);
        before_drop += usize::from(told.try_recv().is_ok());
    }
    assert_eq!(before_return, 50, "callbacks run when wait_lost returned");
    assert_eq!(
        before_return + before_drop,
        50,
        "callbacks run when the drop returned"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_drop_after_is_held_saw_the_loss_waits_for_a_slow_callback() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let ttl = Duration::from_millis(200);
    for run in 0..10 {
        let guard = locks.lock(format!("run:{run}"), capped(ttl)).unwrap();
        let (tell, told) = mpsc::channel();
        guard.on_lost(move |_| {
            // Some work before the callback is done.
            std::thread::sleep(Duration::from_millis(20));
            tell.send(()).unwrap();
        });
        wait_until(10 * ttl, "the lock runs out", || !guard.is_held());
        assert!(matches!(guard.unlock(), Err(LockError::Lost { .. })));
        assert_eq!(told.try_recv(), Ok(()), "run {run}: unlock did not wait");
    }
}

#[test]
fn a_callback_that_drops_or_unlocks_its_own_guard_returns_at_once() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let (ran, runs) = mpsc::channel();
    let mut waited = vec![];
    for (resource, unlock) in [("drops", false), ("unlocks", true)] {
        let guard = Arc::new(Mutex::new(None::<LockGuard>));
        let own = Arc::clone(&guard);
        let tell = ran.clone();
        let held = lock(&locks, resource);
        held.on_lost(move |_| {
            let start = Instant::now();
            let guard = own.lock().unwrap().take().expect("the guard");
            // Within its own callback, no wait for itself either.
            assert!(guard.wait_lost(Duration::from_secs(10)));
            if unlock {
                assert!(matches!(guard.unlock(), Err(LockError::Lost { .. })));
            } else {
                drop(guard);
            }
            tell.send((resource, start.elapsed())).unwrap();
        });
        *guard.lock().unwrap() = Some(held);
        take_over(&nodes, resource);
        waited.push(guard);
    }
    for _ in 0..2 {
        let (resource, took) = runs.recv_timeout(5 * TTL).expect("the callback returned");
        assert!(took < TTL, "{resource}: its callback took {took:?}");
    }
    assert!(waited.iter().all(|guard| guard.lock().unwrap().is_none()));
}
