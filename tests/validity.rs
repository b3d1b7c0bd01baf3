//! The validity rules, through the public API, against real nodes behind
//! the harness's fault proxy:
//!
//! - a lock's validity is `ttl - elapsed - drift`, measured from before the
//!   round's first write: a round slowed by the proxy leaves that much less,
//!   after an acquisition and after an extension alike;
//! - no lock is granted with no validity left: a round slower than the TTL
//!   is `TooSlow`, for an acquisition and for an extension alike;
//! - a reply left unread by a round that timed out never answers a later
//!   command, nor a reply to one thread's command another thread's;
//! - a lease declared lost stays lost, even when a late extension lands.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_sync::{LockError, Redlock, RedlockBuilder, RetryPolicy};
use redlock_sync_testing::{Cluster, Fault, Proxy};

/// Nodes, a proxy in front of each, and a builder for clients that talk to
/// the nodes through the proxies only, one round per call.
fn behind_proxies(n: usize, io_timeout: Duration) -> (Cluster, Vec<Proxy>, RedlockBuilder) {
    let nodes = cluster(n);
    let proxies = nodes.proxies().expect("a proxy per node");
    let builder = Redlock::builder(proxies.iter().map(Proxy::url))
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(io_timeout)
        .connect_timeout(io_timeout);
    (nodes, proxies, builder)
}

/// Opens the client's connections (so that faults meet open ones). A
/// busy machine may make a short `io_timeout` miss a round, and the client
/// then waits to connect again: try for a while.
fn warm_up(locks: &Redlock) {
    let start = Instant::now();
    loop {
        match locks.try_acquire("warm-up", Duration::from_secs(10)) {
            Ok(lock) => {
                let _ = locks.release(lock);
                return;
            }
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(20),
                "a healthy cluster grants: {e}"
            ),
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn set_fault(proxies: &[Proxy], fault: Fault) {
    for proxy in proxies {
        proxy.set_fault(fault);
    }
}

/// Runs an acquisition (or, if `extension`, an extension of a lock taken
/// just before) with every byte delayed 150 ms each way, and checks the
/// validity it leaves: the TTL less the round's time less the drift,
/// counted from before the round's first write.
fn slowed_round_leaves_ttl_less_its_time_and_the_drift(extension: bool) {
    const TTL: Duration = Duration::from_secs(10);
    const DELAY: Duration = Duration::from_millis(150);
    // A large drift factor, so that a validity that forgot the drift term
    // is a second off.
    const DRIFT_FACTOR: f64 = 0.1;
    let drift = TTL.mul_f64(DRIFT_FACTOR) + Duration::from_millis(2);
    let (_nodes, proxies, builder) = behind_proxies(3, Duration::from_secs(2));
    let locks = builder.drift_factor(DRIFT_FACTOR).build().unwrap();
    warm_up(&locks);
    let taken = extension.then(|| locks.try_acquire("slowed", TTL).unwrap());

    set_fault(&proxies, Fault::Delay(DELAY));
    let before = Instant::now();
    let lock = match taken {
        Some(mut lock) => {
            (locks.extend(&mut lock, TTL)).expect("a slow quorum still extends");
            lock
        }
        None => (locks.try_acquire("slowed", TTL)).expect("a slow quorum still grants"),
    };
    let after = Instant::now();
    set_fault(&proxies, Fault::None);

    // Every key was set or renewed after `before` and expires a TTL later
    // on its node, less the drift on this client's clock: the lock may be
    // valid until the round's start + TTL - drift, and no later. Every
    // reply the round counted came through a proxy, delayed on the way
    // there and back, so the round took at least twice the delay and began
    // at least that long before `after`: the validity seen at `after` is
    // smaller than TTL - drift by at least the round trip the proxy added.
    let latest = after - 2 * DELAY + TTL - drift;
    assert!(
        lock.valid_until() <= latest,
        "the validity runs {:?} past what a round of at least {:?} begun before {:?} leaves: {}",
        lock.valid_until() - latest,
        2 * DELAY,
        after - before,
        lock.report()
    );
    // And it is not shorter than the whole call leaves.
    let earliest = before + TTL - drift - (after - before);
    assert!(
        lock.valid_until() >= earliest,
        "the validity ends {:?} before what the call's own time leaves: {}",
        earliest - lock.valid_until(),
        lock.report()
    );
    locks.release(lock).unwrap();
}

#[test]
fn a_round_slowed_by_the_proxy_leaves_the_ttl_less_its_time_and_the_drift_counted_from_before_its_first_write(
) {
    slowed_round_leaves_ttl_less_its_time_and_the_drift(false);
}

#[test]
fn an_extension_slowed_by_the_proxy_leaves_the_ttl_less_its_time_and_the_drift_counted_from_before_its_first_write(
) {
    slowed_round_leaves_ttl_less_its_time_and_the_drift(true);
}

#[test]
fn a_round_slower_than_the_ttl_is_too_slow_although_a_quorum_granted() {
    const TTL: Duration = Duration::from_millis(200);
    // A round trip of 300 ms through the proxies, within the io_timeout.
    const DELAY: Duration = Duration::from_millis(150);
    let (nodes, proxies, builder) = behind_proxies(3, Duration::from_secs(2));
    let locks = builder.build().unwrap();
    warm_up(&locks);

    set_fault(&proxies, Fault::Delay(DELAY));
    for (call, result) in [
        ("try_acquire", locks.try_acquire("too-slow", TTL)),
        ("acquire", locks.acquire("too-slow", TTL)),
    ] {
        match result {
            Err(LockError::TooSlow { report, .. }) => {
                assert!(report.granted() >= report.quorum, "{call}: {report}");
                assert!(report.elapsed >= 2 * DELAY, "{call}: {report}");
            }
            Ok(lock) => panic!(
                "{call}: granted with {:?} of validity after a round slower than the TTL: {}",
                lock.validity(),
                lock.report()
            ),
            Err(e) => panic!("{call}: expected TooSlow, got {e}"),
        }
    }
    assert!(
        locks.lock("too-slow", TTL).is_err(),
        "lock: no guard for a lock with no validity"
    );
    set_fault(&proxies, Fault::None);
    drop(nodes);
}

#[test]
fn an_extension_slower_than_the_ttl_is_too_slow_and_leaves_the_lock_as_it_was() {
    const DELAY: Duration = Duration::from_millis(150);
    let (_nodes, proxies, builder) = behind_proxies(3, Duration::from_secs(2));
    let locks = builder.build().unwrap();
    warm_up(&locks);
    let mut lock = locks
        .try_acquire("extend-too-slow", Duration::from_secs(10))
        .unwrap();
    let valid_until = lock.valid_until();

    set_fault(&proxies, Fault::Delay(DELAY));
    match locks.extend(&mut lock, Duration::from_millis(200)) {
        Err(LockError::TooSlow { report, .. }) => {
            assert!(report.granted() >= report.quorum, "{report}");
        }
        other => panic!(
            "expected TooSlow, got {other:?}; validity now {:?}",
            lock.validity()
        ),
    }
    assert_eq!(
        lock.valid_until(),
        valid_until,
        "the lock is left as it was"
    );
    set_fault(&proxies, Fault::None);
}

#[test]
fn a_reply_that_comes_after_the_io_timeout_is_never_read_as_the_next_commands_reply() {
    const IO_TIMEOUT: Duration = Duration::from_millis(200);
    // A round trip of 300 ms: the reply comes 100 ms after the deadline.
    const DELAY: Duration = Duration::from_millis(150);
    let (nodes, proxies, builder) = behind_proxies(1, IO_TIMEOUT);
    let locks = builder.build().unwrap();
    nodes.node(0).set("held", "another-client").unwrap();
    warm_up(&locks);

    for round in 0..3 {
        set_fault(&proxies, Fault::Delay(DELAY));
        let late = locks.try_acquire(format!("late-{round}"), Duration::from_secs(10));
        assert!(
            late.is_err(),
            "round {round}: no reply within the io_timeout"
        );
        set_fault(&proxies, Fault::None);
        // The late `OK` to the SET above is on its way. Every later
        // command's answer is its own: a refusal (the key is held), or no
        // answer while the client waits to connect again (its clean-up of
        // the late SET met the delay too). Never a grant.
        let start = Instant::now();
        let mut refusals = 0;
        while start.elapsed() < Duration::from_secs(20) && refusals < 3 {
            match locks.try_acquire("held", Duration::from_secs(10)) {
                Err(LockError::Contended { .. }) => refusals += 1,
                Ok(lock) => panic!(
                    "round {round}: granted a lock another client holds: {}",
                    lock.report()
                ),
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
        assert_eq!(refusals, 3, "round {round}: the node answers again");
        assert_eq!(
            nodes.node(0).get("held").unwrap().as_deref(),
            Some("another-client")
        );
    }
}

#[test]
fn replies_never_cross_between_threads_while_their_connection_drops_under_them() {
    const IO_TIMEOUT: Duration = Duration::from_millis(100);
    const THREADS: usize = 8;
    const RUN: Duration = Duration::from_secs(3);
    let (nodes, proxies, builder) = behind_proxies(1, IO_TIMEOUT);
    let locks = builder.build().unwrap();
    for t in 0..THREADS {
        nodes
            .node(0)
            .set(&format!("held-{t}"), "another-client")
            .unwrap();
    }
    warm_up(&locks);

    let stop = AtomicBool::new(false);
    let granted = AtomicU64::new(0);
    let refused = AtomicU64::new(0);
    let node = nodes.node(0);
    thread::scope(|scope| {
        // Connections drop under the threads: replies late past the
        // io_timeout (one thread times out while others, who started
        // later, still wait on the same connection), and resets.
        scope.spawn(|| {
            let faults = [
                Fault::None,
                Fault::Delay(Duration::from_millis(30)),
                Fault::Delay(Duration::from_millis(70)),
                Fault::None,
                Fault::Reset,
            ];
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                set_fault(&proxies, faults[i % faults.len()]);
                i += 1;
                thread::sleep(Duration::from_millis(40));
            }
            set_fault(&proxies, Fault::None);
        });
        for t in 0..THREADS {
            let (locks, stop, granted, refused) = (&locks, &stop, &granted, &refused);
            scope.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if t % 2 == 0 {
                        // Every reply to these is a refusal.
                        let held = format!("held-{t}");
                        match locks.try_acquire(&held, Duration::from_secs(10)) {
                            Ok(lock) => panic!(
                                "thread {t}: granted {held}, which another client holds: {}",
                                lock.report()
                            ),
                            Err(LockError::Contended { .. }) => {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {}
                        }
                    } else {
                        // Every grant must be the node's answer to this SET.
                        let free = format!("free-{t}-{i}");
                        if let Ok(lock) = locks.try_acquire(&free, Duration::from_secs(10)) {
                            let token = lock.token().to_string();
                            assert_eq!(
                                node.get(&free).unwrap().as_deref(),
                                Some(token.as_str()),
                                "thread {t}: granted {free}, which the node does not hold: {}",
                                lock.report()
                            );
                            granted.fetch_add(1, Ordering::Relaxed);
                            let _ = locks.release(lock);
                        }
                    }
                }
            });
        }
        thread::sleep(RUN);
        stop.store(true, Ordering::Relaxed);
    });
    // The run did what it is for: both kinds of answer came through.
    assert!(granted.load(Ordering::Relaxed) > 0, "no grant at all");
    assert!(refused.load(Ordering::Relaxed) > 0, "no refusal at all");
    for t in 0..THREADS {
        assert_eq!(
            node.get(&format!("held-{t}")).unwrap().as_deref(),
            Some("another-client")
        );
    }
}

/// The lease of a guard whose extension lands on the nodes in time, but
/// whose reply comes back after the guard's validity ran out, with some
/// validity of its own left. With `observe`, the test watches the guard
/// meanwhile (and sees it lost); without, nobody looks until the extension
/// is back.
fn a_late_extension_does_not_revive_the_lease(observe: bool) {
    const TTL: Duration = Duration::from_secs(6);
    // The validity is about 5.94 s. The watchdog extends when a third of
    // it is left, about 3.96 s after the acquisition; the extension
    // reaches the nodes 1.25 s later, 0.8 s before the keys would expire
    // there, and its reply comes back at about 6.46 s, 0.5 s after the
    // guard's validity ran out. The extension leaves a validity until
    // about 7.4 s (its start + TTL - its 2.5 s - drift): a lease revived
    // by it would be held for almost a second more.
    const DELAY: Duration = Duration::from_millis(1250);
    let (nodes, proxies, builder) = behind_proxies(3, Duration::from_secs(4));
    let locks = builder.build().unwrap();
    warm_up(&locks);
    let guard = locks.lock("lease", TTL).expect("a healthy cluster grants");
    set_fault(&proxies, Fault::Delay(DELAY));

    // The extension lands on node 0 when the key's time to live there
    // jumps back up; its reply is back a delay later. (Not the
    // acquisition's own `SET`, if node 0's was held up by the delay: the
    // key must have been seen there first.)
    let mut last = i64::MAX;
    let mut seen_lost = false;
    wait_until(TTL, "the extension landed on node 0", || {
        seen_lost |= observe && !guard.is_held();
        let pttl = nodes.node(0).pttl("lease").unwrap();
        let jumped = last > 0 && pttl > last.saturating_add(500);
        last = pttl;
        jumped
    });
    let back = Instant::now() + DELAY + Duration::from_millis(200);
    if observe {
        wait_until(
            back - Instant::now(),
            "the guard's validity ran out",
            || !guard.is_held(),
        );
        holds_throughout(back - Instant::now(), "the lease lost for good", || {
            !guard.is_held() && guard.check().is_err()
        });
    } else {
        assert!(!seen_lost);
        thread::sleep(back - Instant::now());
    }
    assert!(
        nodes.node(0).pttl("lease").unwrap() > 0,
        "the extended key is still there"
    );
    assert!(!guard.is_held(), "a late extension revived the lease");
    assert!(guard.validity().is_zero());
    assert!(matches!(guard.check(), Err(LockError::Lost { .. })));
    set_fault(&proxies, Fault::None);
    assert!(matches!(guard.unlock(), Err(LockError::Lost { .. })));
}

#[test]
fn a_lease_whose_validity_ran_out_unseen_stays_lost_when_a_late_extension_lands() {
    a_late_extension_does_not_revive_the_lease(false);
}

#[test]
fn a_lease_seen_lost_stays_lost_when_a_late_extension_lands() {
    a_late_extension_does_not_revive_the_lease(true);
}
