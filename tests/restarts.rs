//! Locks across node restarts: an extension sets the key again (a re-take)
//! on a node that restarted empty, so a lock held by `with_lock` or a guard
//! outlives a rolling restart of every node, as an upgrade does it; and
//! what a re-take may not do. (The restart guard's own clock, for a node
//! whose clock is stepped after it restarted, is tested on the `INFO`
//! replies the guard reads, in its unit tests.)

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{builder, cluster, wait_until, SETTLE};
use redlock_sync::{Kind, Lock, LockError, LockOptions, NodeOutcome, Redlock, RetryPolicy, Token};
use redlock_sync_testing::{Cluster, Fault};

const TTL: Duration = Duration::from_secs(1);
const GRACE: Duration = Duration::from_secs(2);

/// Who keeps the lock alive while the nodes restart.
#[derive(Debug, Clone, Copy)]
enum Holder {
    WithLock,
    Guard,
}

/// A client over `nodes` with the restart guard at `grace` (zero: off),
/// once every node votes for it: with the guard on, fresh nodes are kept
/// out until their grace has passed.
fn warmed_up(nodes: &Cluster, grace: Duration) -> Redlock {
    let locks = builder(nodes).restart_grace(grace).build().unwrap();
    every_node_answers(&locks);
    locks
}

/// Waits until every node answers `locks` (a node the guard keeps out, or
/// a dead connection, shows as failed in a report).
fn every_node_answers(locks: &Redlock) {
    wait_until(Duration::from_secs(10), "every node answers", || {
        locks
            .try_acquire("warm-up", TTL)
            .and_then(|lock| locks.release(lock))
            .is_ok_and(|report| {
                (report.nodes.iter())
                    .all(|n| !matches!(n.outcome, NodeOutcome::Failed(_) | NodeOutcome::TimedOut))
            })
    });
}

/// Whether every node holds `token` under every one of `resources`.
fn all_hold(nodes: &Cluster, resources: &[&str], token: &Token) -> bool {
    let token = token.to_string();
    (nodes.nodes().iter())
        .all(|n| (resources.iter()).all(|r| n.get(r).ok().flatten().as_deref() == Some(&*token)))
}

/// Holds a lock of `kind` on `resources` (TTL 1 s) with `holder`, with the
/// restart guard at `grace`, while every node of 5 in turn is killed and
/// started empty on its port, just above the spacing docs/contract.md
/// gives (0.8 s apart with the guard off, 2 s with it); meanwhile a second
/// client tries every 100 ms. Checks that the lock
/// was never lost, the second client never got it, and every node holds
/// the lock at the end. Returns the lock's fencing token and the nodes.
fn rolling_restart(
    holder: Holder,
    grace: Duration,
    resources: &[&str],
    kind: Kind,
) -> (Option<u64>, Cluster) {
    let nodes = cluster(5);
    if kind == Kind::Fenced {
        // Far above the clocks (the nodes share one): a counter that
        // restarted from the clock would hand out smaller tokens.
        let far = SystemClock::micros() + 1_000_000_000_000;
        for node in nodes.nodes() {
            let key = redlock_sync::fence_key(resources[0]);
            node.query(&["SET", &key, &far.to_string()]).unwrap();
        }
    }
    let (holding, other) = (warmed_up(&nodes, grace), warmed_up(&nodes, grace));
    let options = LockOptions::new(TTL).kind(kind);
    // Just above the rule of docs/contract.md, with the default
    // extend_when_left of 1/3: an extension every I = 2/3 TTL; with the
    // guard off, restarts more than I apart; with it on, more than
    // (grace + 1 s + I) / (N - quorum), here (2 s + 1 s + 0.67 s) / 2.
    let interval = TTL.mul_f64(2.0 / 3.0);
    let gap = if grace.is_zero() {
        interval.mul_f64(1.2)
    } else {
        (grace + Duration::from_secs(1) + interval).mul_f64(0.55)
    };
    // After the last restart: a kept-out node votes again within the grace
    // plus the uptime's rounding, then the next extension re-takes; the
    // rest is room for a busy machine (3 s of it was too little).
    let settle = grace + Duration::from_secs(8);
    let [held_now, stop, stopped] = [(); 3].map(|()| AtomicBool::new(false));
    let roll = |token: &Token| {
        held_now.store(true, Ordering::Relaxed);
        for node in nodes.nodes() {
            thread::sleep(gap);
            node.restart().unwrap();
        }
        let start = Instant::now();
        while !all_hold(&nodes, resources, token) {
            let held: Vec<_> = (resources.iter())
                .map(|r| common::values(&nodes, r))
                .collect();
            assert!(
                start.elapsed() < settle,
                "not every node holds {token} again after {settle:?}: {held:?}"
            );
            thread::sleep(Duration::from_millis(5));
        }
        // The second client stops trying before the lock is released.
        stop.store(true, Ordering::Relaxed);
        wait_until(SETTLE, "the second client stopped", || {
            stopped.load(Ordering::Relaxed)
        });
    };
    let (held, won) = thread::scope(|s| {
        // The second client stops also when the holder's side panics.
        let _stops = StopOnDrop(&stop);
        let trying = s.spawn(|| {
            let mut won = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(100));
                if !held_now.load(Ordering::Relaxed) {
                    continue;
                }
                if let Ok(lock) = other.try_acquire(resources, options.clone()) {
                    won.push(lock.report().to_string());
                    let _ = other.release(lock);
                }
            }
            stopped.store(true, Ordering::Relaxed);
            won
        });
        let held = match holder {
            Holder::WithLock => holding.with_lock(resources, options.clone(), |guard| {
                roll(guard.token());
                guard.check()?;
                Ok::<_, LockError>(guard.fencing_token())
            }),
            Holder::Guard => holding.lock(resources, options.clone()).and_then(|guard| {
                roll(guard.token());
                let fence = guard.fencing_token();
                guard.unlock().map(|_| fence)
            }),
        };
        stop.store(true, Ordering::Relaxed);
        (held, trying.join().unwrap())
    });
    let what = format!("{kind:?} lock on {resources:?} held by {holder:?}, grace {grace:?}");
    // A lock lost first (a busy machine may stall its extensions past the
    // TTL) is said as such: a second client may then rightly get it.
    let fence = held.unwrap_or_else(|e| panic!("{what}: lost across the restarts: {e}"));
    assert!(won.is_empty(), "{what}: a second client got it: {won:?}");
    (fence, nodes)
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Microseconds since the epoch, as the nodes' clocks count.
struct SystemClock;

impl SystemClock {
    fn micros() -> u64 {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.unwrap().as_micros() as u64
    }
}

/// Eight rolling restarts at once (one at a time, 5 nodes each, they take
/// some 20 s): a lock on one resource under `with_lock` and a guard, with
/// the restart guard off and on; a lock on three resources; and a fenced
/// lock, after which no node's counter, nor the next token, is below its
/// fencing token.
#[test]
fn a_lock_on_one_or_many_resources_plain_or_fenced_outlives_a_rolling_restart_of_every_node_and_no_later_token_is_smaller(
) {
    thread::scope(|s| {
        for holder in [Holder::WithLock, Holder::Guard] {
            for grace in [Duration::ZERO, GRACE] {
                s.spawn(move || rolling_restart(holder, grace, &["leader"], Kind::Plain));
            }
        }
        for (holder, grace) in [(Holder::WithLock, Duration::ZERO), (Holder::Guard, GRACE)] {
            s.spawn(move || rolling_restart(holder, grace, &["from", "to", "log"], Kind::Plain));
        }
        for (holder, grace) in [(Holder::Guard, Duration::ZERO), (Holder::WithLock, GRACE)] {
            s.spawn(move || {
                let (fence, nodes) = rolling_restart(holder, grace, &["ledger"], Kind::Fenced);
                let fence = fence.expect("a fenced lock has a fencing token");
                // Every node lost its counter; the re-takes raised it again.
                for node in nodes.nodes() {
                    let counter = node.get(&redlock_sync::fence_key("ledger")).unwrap();
                    let counter: u64 = counter.expect("a counter").parse().unwrap();
                    assert!(
                        counter >= fence,
                        "counter {counter} below the token {fence}"
                    );
                }
                let locks = warmed_up(&nodes, grace);
                let next = locks.acquire("ledger", common::fenced(TTL)).unwrap();
                let later = next.fencing_token().unwrap();
                assert!(later > fence, "token {later} after {fence}");
                locks.release(next).unwrap();
            });
        }
    });
}

#[test]
fn the_first_extension_after_a_node_restarted_reaches_it_on_a_new_connection_and_re_takes_it() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let ttl = Duration::from_secs(10);
    let mut lock = locks.acquire("after-restart", ttl).unwrap();
    common::wait_until_held_by(&nodes, &lock, 3);
    // The client's connection to node 0 now leads to a process that is
    // gone: the round finds it closed, and sends again on a new one.
    nodes.node(0).restart().unwrap();
    locks.extend(&mut lock, ttl).unwrap();
    assert!(lock.report().nodes[0].retook, "{:?}", lock.report());
    common::wait_until_held_by(&nodes, &lock, 3);
    locks.release(lock).unwrap();
}

#[test]
fn a_node_where_another_token_holds_a_key_refuses_the_re_take_and_a_node_re_takes_all_keys_or_none()
{
    let nodes = cluster(5);
    let locks = builder(&nodes).build().unwrap();
    let mut lock = locks.acquire(["a", "b"], Duration::from_secs(10)).unwrap();
    common::wait_until_held_by(&nodes, &lock, 5);
    // Node 0 restarted empty and another client took `b` there; node 1
    // restarted empty.
    nodes.node(0).restart().unwrap();
    nodes.node(0).set("b", "another-client").unwrap();
    nodes.node(1).restart().unwrap();
    every_node_answers(&locks);
    locks.extend(&mut lock, Duration::from_secs(10)).unwrap();
    let report = lock.report();
    // The three nodes that kept the keys renewed them; the re-take made up
    // node 1, and node 0 refused it.
    assert_eq!(report.granted(), 3, "{report}");
    assert_eq!(report.nodes[0].outcome, NodeOutcome::Refused, "{report}");
    assert!(!report.nodes[0].retook, "{report:?}");
    assert!(report.nodes[1].retook, "{report:?}");
    assert!(!report.nodes[2].retook, "node 2 renewed: {report:?}");
    let token = lock.token().to_string();
    // The round that held read the re-take, so it is confirmed.
    wait_until(SETTLE, "node 1 re-took both keys", || {
        nodes.node(1).get("a").unwrap().as_deref() == Some(&*token)
            && nodes.node(1).get("b").unwrap().as_deref() == Some(&*token)
    });
    assert_eq!(nodes.node(0).get("a").unwrap(), None, "all or none");
    assert_eq!(
        nodes.node(0).get("b").unwrap().as_deref(),
        Some("another-client")
    );
    locks.release(lock).unwrap();
}

#[test]
fn an_extension_whose_round_ends_after_the_validity_ran_out_reports_lost_and_releases_what_it_re_took(
) {
    late_round_re_takes(&[0, 1], &[], QUICK);
}

#[test]
fn a_late_extension_that_re_took_the_key_on_every_node_reports_lost_and_releases_it() {
    // Every vote it could count is a re-take made too late: none renewed.
    late_round_re_takes(&[0, 1, 2], &[], QUICK);
}

#[test]
fn a_late_extension_that_re_took_the_key_on_one_node_while_the_others_were_silent_reports_lost_and_releases_it(
) {
    // One late re-take, and no answer from the rest: nothing renewed, and
    // the silent nodes are not counted as renewing.
    late_round_re_takes(&[0], &[1, 2], QUICK);
}

#[test]
fn a_late_extension_whose_re_take_was_never_answered_releases_it_on_every_node_that_did_not_refuse()
{
    // Node 0 re-takes the key at once but its reply trickles past the
    // deadline a byte a second (never silent for the 1.5 s I/O timeout),
    // as the silent nodes time out: the round never reads the
    // re-take, and must still release it.
    late_round_re_takes(&[0], &[1, 2], Fault::TrickleReplies(Duration::from_secs(1)));
}

/// The fault of the nodes that answer a late round: their replies come
/// after the validity ran out.
const QUICK: Fault = Fault::Delay(Duration::from_millis(300));

/// An extension whose round ends after the validity ran out, with the key
/// gone from the nodes `restarted` and the nodes `partitioned` silent
/// behind the proxy, the others answering under `answering`: lost, and
/// nothing it set stays.
fn late_round_re_takes(restarted: &[usize], partitioned: &[usize], answering: Fault) {
    let nodes = cluster(3);
    let proxies = nodes.proxies().unwrap();
    let locks = Redlock::builder(proxies.iter().map(|p| p.url()))
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let mut lock = locks.acquire("late", Duration::from_secs(3)).unwrap();
    common::wait_until_held_by(&nodes, &lock, 3);
    // These nodes lose the key. When 400 ms of validity are left, every
    // byte starts to take 300 ms each way (or, to the partitioned nodes,
    // never arrives): the round's commands land within the validity, and
    // its replies come after it ran out.
    for &i in restarted {
        nodes.node(i).restart().unwrap();
    }
    every_node_answers(&locks);
    // The nodes to be partitioned answered slowly of late: a round reads
    // the quick nodes first, so the re-take's reply is read before the
    // silent nodes time out (not left unread behind them).
    for &i in partitioned {
        proxies[i].set_fault(Fault::Delay(Duration::from_millis(50)));
    }
    if !partitioned.is_empty() {
        for _ in 0..3 {
            locks.inspect("late").unwrap();
        }
    }
    thread::sleep(lock.validity().saturating_sub(Duration::from_millis(400)));
    for (i, proxy) in proxies.iter().enumerate() {
        proxy.set_fault(if partitioned.contains(&i) {
            Fault::Partition
        } else {
            answering
        });
    }
    assert!(lock.is_valid(), "the round must start within the validity");
    let result = locks.extend(&mut lock, Duration::from_secs(30));
    let ended = Instant::now();
    for proxy in &proxies {
        proxy.set_fault(Fault::None);
    }
    assert!(
        ended > lock.valid_until(),
        "the round ended within the validity"
    );
    match result {
        Err(LockError::Lost { report, .. }) => {
            let read = answering == QUICK;
            assert!(!read || report.nodes.iter().any(|n| n.retook), "{report:?}");
        }
        other => panic!("expected the lost error, got {other:?}"),
    }
    // Nothing it set stays: well before the 30 s it asked for, no node
    // holds the token (a silent node's key expires with the TTL it had).
    let token = lock.token().to_string();
    // A release the round could not send goes first on the next
    // connection, which `inspect` opens once the connect backoff is over.
    wait_until(Duration::from_secs(10), "no node holds the token", || {
        let _ = locks.inspect("late");
        (nodes.nodes().iter()).all(|n| n.get("late").unwrap().as_deref() != Some(&*token))
    });
}

#[test]
fn extending_a_lock_rebuilt_from_its_token_re_takes_nothing_until_an_extension_timed_it() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let acquired = locks.acquire("rebuilt", Duration::from_secs(10)).unwrap();
    common::wait_until_held_by(&nodes, &acquired, 3);
    nodes.node(0).restart().unwrap();
    let mut lock = Lock::from_token("rebuilt", *acquired.token(), Kind::Plain).unwrap();
    every_node_answers(&locks);
    locks.extend(&mut lock, Duration::from_secs(10)).unwrap();
    thread::sleep(Duration::from_millis(200));
    assert_ne!(lock.report().nodes[0].outcome, NodeOutcome::Granted);
    assert_eq!(nodes.node(0).get("rebuilt").unwrap(), None, "re-taken");
    // That extension measured the validity: the next one re-takes.
    locks.extend(&mut lock, Duration::from_secs(10)).unwrap();
    // Node 0 re-took the key; its reply says so where the round awaited it
    // (two quick nodes may decide the round first).
    let first = &lock.report().nodes[0];
    assert!(
        first.retook || first.outcome == NodeOutcome::NotAwaited,
        "{:?}",
        lock.report()
    );
    common::wait_until_held_by(&nodes, &lock, 3);
    locks.release(lock).unwrap();
}
