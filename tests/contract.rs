//! The contract's rules for extensions and releases (docs/contract.md),
//! each shown against real nodes with the fault that would break it:
//!
//! - a lock holds only while the nodes that *renewed* it make a quorum: a
//!   re-take restores a node that lost the key, but never hides that a
//!   majority lost it (and another client may have held it meanwhile);
//! - a re-take counts later only if a round that held read its reply: one
//!   that lands late, after the lock ended, never passes for a renewal;
//! - an extension refused in time releases what it re-took;
//! - a release says whether the lock was held throughout, by the same
//!   counting.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redlock_sync::{Kind, Lock, LockError, LockOptions, Loss, NodeOutcome, Redlock, RetryPolicy};
use redlock_sync_testing::{Cluster, Fault, Proxy};

/// Whether no node holds a value of `token`'s (re-taken or not).
fn none_holds(nodes: &Cluster, key: &str, token: &str) -> bool {
    values(nodes, key)
        .iter()
        .all(|v| !v.as_deref().is_some_and(|v| v.starts_with(token)))
}

/// Empties nodes `which`, as a `FLUSHALL`, an eviction or a failover to a
/// replica that lacks the key would, with no restart the guard could see.
fn lose_data(nodes: &Cluster, which: &[usize]) {
    for &i in which {
        nodes.node(i).flushall().unwrap();
    }
}

/// Another client takes `resource` on the nodes that lost it, works, and
/// releases it.
fn another_client_comes_and_goes(nodes: &Cluster, resource: &str) {
    let other = client(nodes);
    let lock = other
        .acquire(resource, Duration::from_secs(10))
        .expect("the nodes that lost the key make a quorum for another client");
    other.release(lock).unwrap();
}

#[test]
fn a_guard_whose_key_a_majority_lost_is_told_lost_at_its_next_extension_although_it_could_re_take_it(
) {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let guard = locks.lock("r", Duration::from_secs(2)).unwrap();
    let (told, heard) = mpsc::channel();
    guard.on_lost(move |e| drop(told.send(e.to_string())));
    wait_until(SETTLE, "3 nodes hold the lock", || {
        values(&nodes, "r").iter().flatten().count() == 3
    });
    lose_data(&nodes, &[1, 2]);
    another_client_comes_and_goes(&nodes, "r");
    // The next extension is due about 1.3 s after the acquisition.
    assert!(
        guard.wait_lost(Duration::from_secs(10)),
        "the watchdog re-took the lost keys and went on as if held"
    );
    assert!(matches!(guard.check(), Err(LockError::Lost { .. })));
    heard
        .recv_timeout(Duration::from_secs(10))
        .expect("on_lost ran");
    let token = guard.token().to_string();
    assert!(matches!(guard.unlock(), Err(LockError::Lost { .. })));
    wait_until(SETTLE, "nothing re-taken stays", || {
        none_holds(&nodes, "r", &token)
    });
}

#[test]
fn with_lock_returns_lost_when_a_majority_lost_the_key_while_the_closure_ran() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let result = locks.with_lock("r", Duration::from_secs(2), |guard| {
        wait_until(SETTLE, "3 nodes hold the lock", || {
            values(&nodes, "r").iter().flatten().count() == 3
        });
        lose_data(&nodes, &[0, 2]);
        another_client_comes_and_goes(&nodes, "r");
        guard.wait_lost(Duration::from_secs(10));
        Ok::<_, LockError>(())
    });
    assert!(
        matches!(result, Err(LockError::Lost { .. })),
        "with_lock said {result:?} although another client held the lock"
    );
}

#[test]
fn extending_a_lock_whose_key_a_majority_lost_is_lost_and_releases_what_it_re_took() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let mut lock = locks.acquire("r", Duration::from_secs(10)).unwrap();
    wait_until_held_by(&nodes, &lock, 3);
    lose_data(&nodes, &[0, 1]);
    let result = locks.extend(&mut lock, Duration::from_secs(10));
    match &result {
        Err(LockError::Lost { report, reason, .. }) => {
            let retook = report.nodes.iter().filter(|n| n.retook).count();
            assert_eq!(retook, 2, "{report:?}");
            assert_eq!(*reason, Loss::Gone(2));
        }
        other => panic!("expected the lost error, got {other:?}"),
    }
    // The extension ended well within the validity: what it re-took (and
    // the key it renewed) goes, not 10 s later.
    let token = lock.token().to_string();
    wait_until(SETTLE, "nothing re-taken stays", || {
        none_holds(&nodes, "r", &token)
    });
}

#[test]
fn extending_a_lock_another_token_holds_on_a_majority_is_lost_and_says_so() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let mut lock = locks.acquire("r", Duration::from_secs(10)).unwrap();
    wait_until_held_by(&nodes, &lock, 3);
    for i in [0, 2] {
        nodes.node(i).set("r", "another-client").unwrap();
    }
    let result = locks.extend(&mut lock, Duration::from_secs(10));
    match &result {
        Err(e @ LockError::Lost { reason, .. }) => {
            assert_eq!(*reason, Loss::Taken(2));
            assert!(e.to_string().contains("another token"), "{e}");
        }
        other => panic!("expected the lost error, got {other:?}"),
    }
    // Nothing of another client's was touched.
    assert_eq!(values(&nodes, "r")[0].as_deref(), Some("another-client"));
}

#[test]
fn a_minority_that_lost_the_key_is_re_taken_so_that_losing_another_minority_later_still_leaves_a_quorum_of_renewals(
) {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let ttl = Duration::from_secs(10);
    let mut lock = locks.acquire(["a", "b"], ttl).unwrap();
    wait_until_held_by(&nodes, &lock, 5);
    lose_data(&nodes, &[0, 1]);
    locks.extend(&mut lock, ttl).unwrap();
    let retook: Vec<bool> = lock.report().nodes.iter().map(|n| n.retook).collect();
    assert_eq!(
        retook,
        [true, true, false, false, false],
        "{:?}",
        lock.report()
    );
    assert_eq!(lock.report().granted(), 3, "renewals: {}", lock.report());
    // The round read both re-takes and held: they are confirmed, and the
    // nodes hold the token itself again.
    wait_until_held_by(&nodes, &lock, 5);
    lose_data(&nodes, &[2, 3]);
    locks.extend(&mut lock, ttl).unwrap();
    let renewed: Vec<bool> = (lock.report().nodes.iter())
        .map(|n| n.outcome == NodeOutcome::Granted)
        .collect();
    assert_eq!(
        renewed,
        [true, true, false, false, true],
        "{:?}",
        lock.report()
    );
    wait_until_held_by(&nodes, &lock, 5);
    locks.release(lock).unwrap();
}

#[test]
fn a_fenced_re_take_raises_the_counter_of_a_node_that_lost_it_to_the_locks_fencing_token() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let ttl = Duration::from_secs(10);
    let mut lock = locks.acquire("ledger", fenced(ttl)).unwrap();
    let fence = lock.fencing_token().unwrap();
    wait_until_held_by(&nodes, &lock, 5);
    lose_data(&nodes, &[4]);
    locks.extend(&mut lock, ttl).unwrap();
    assert!(lock.report().nodes[4].retook, "{:?}", lock.report());
    let counter = nodes
        .node(4)
        .get(&redlock_sync::fence_key("ledger"))
        .unwrap();
    let counter: u64 = counter.expect("a counter again").parse().unwrap();
    assert!(
        counter >= fence,
        "counter {counter} below the token {fence}"
    );
    locks.release(lock).unwrap();
}

#[test]
fn a_release_after_a_majority_lost_the_key_and_another_client_held_it_is_lost() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let lock = locks.acquire("r", Duration::from_secs(10)).unwrap();
    wait_until_held_by(&nodes, &lock, 3);
    lose_data(&nodes, &[1, 2]);
    another_client_comes_and_goes(&nodes, "r");
    let result = locks.release(lock);
    assert!(
        matches!(result, Err(LockError::Lost { .. })),
        "release said {result:?}: held throughout"
    );
}

/// A's extension round ends in time without a quorum: every node's reply
/// is held up for 2 s, and so is its command. The lock runs out, another
/// client takes the resource and releases it; then the held-up command
/// lands and sets A's key again everywhere, with a full TTL.
fn a_re_take_lands_after_the_lock_ended(ttl: Duration) -> (Cluster, Vec<Proxy>, Redlock, Lock) {
    let nodes = cluster(3);
    let proxies = nodes.proxies().unwrap();
    let a = Redlock::builder(proxies.iter().map(|p| p.url()))
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut lock = a.acquire("r", ttl).unwrap();
    wait_until_held_by(&nodes, &lock, 3);
    for proxy in &proxies {
        proxy.set_fault(Fault::Delay(Duration::from_secs(2)));
    }
    let sent = Instant::now();
    let result = a.extend(&mut lock, ttl);
    assert!(
        matches!(result, Err(LockError::NoQuorum { .. })),
        "{result:?}"
    );
    // Later commands go at once; the held-up ones land 2 s after they left.
    for proxy in &proxies {
        proxy.set_fault(Fault::None);
    }
    let b = contending_client(&nodes);
    let taken = b
        .acquire("r", ttl)
        .expect("another client once A's keys expired");
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "too slow to get in before the held-up re-take"
    );
    b.release(taken).unwrap();
    let token = lock.token().to_string();
    wait_until(Duration::from_secs(5), "the held-up re-take landed", || {
        (values(&nodes, "r").iter()).all(|v| v.as_deref().is_some_and(|v| v.starts_with(&token)))
    });
    (nodes, proxies, a, lock)
}

#[test]
fn a_re_take_that_lands_after_the_lock_ended_never_counts_as_a_renewal() {
    let ttl = Duration::from_secs(1);
    let (nodes, _proxies, a, mut lock) = a_re_take_lands_after_the_lock_ended(ttl);
    let result = a.extend(&mut lock, ttl);
    assert!(
        matches!(result, Err(LockError::Lost { .. })),
        "the extension counted a late re-take as a renewal: {result:?}"
    );
    let token = lock.token().to_string();
    wait_until(SETTLE, "the late re-takes are released", || {
        none_holds(&nodes, "r", &token)
    });
}

#[test]
fn a_release_that_finds_only_late_re_takes_is_lost_and_deletes_them() {
    let ttl = Duration::from_secs(1);
    let (nodes, _proxies, a, lock) = a_re_take_lands_after_the_lock_ended(ttl);
    let token = lock.token().to_string();
    // Released as another process would, from the token alone.
    let rebuilt = Lock::from_token("r", *lock.token(), Kind::Plain).unwrap();
    let result = a.release(rebuilt);
    assert!(
        matches!(result, Err(LockError::Lost { .. })),
        "the release said the lock was held throughout: {result:?}"
    );
    assert!(none_holds(&nodes, "r", &token), "{:?}", values(&nodes, "r"));
}

#[test]
fn a_lock_rebuilt_from_its_token_counts_only_the_keys_that_were_never_lost() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let ttl = Duration::from_secs(10);
    let lock = locks.acquire("r", LockOptions::new(ttl)).unwrap();
    wait_until_held_by(&nodes, &lock, 3);
    let token = lock.token().to_string();
    // Node 0 holds a re-take that no round confirmed, as a late one leaves.
    let marked = format!("{token}~0123456789abcdef");
    nodes.node(0).set("r", &marked).unwrap();
    nodes.node(1).flushall().unwrap();
    let mut rebuilt = Lock::from_token("r", *lock.token(), Kind::Plain).unwrap();
    let result = locks.extend(&mut rebuilt, ttl);
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    // Nothing was written where the key was not ours all along.
    thread::sleep(Duration::from_millis(100));
    assert_eq!(nodes.node(1).get("r").unwrap(), None);
}

/// A client through proxies, one round per call but for the retries of
/// `policy`.
fn through_proxies(nodes: &Cluster, policy: RetryPolicy) -> (Vec<Proxy>, Redlock) {
    let proxies = nodes.proxies().unwrap();
    let locks = Redlock::builder(proxies.iter().map(|p| p.url()))
        .retry_policy(policy)
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    (proxies, locks)
}

#[test]
fn an_extension_nobody_answers_is_not_retried_past_the_locks_validity() {
    let nodes = cluster(3);
    // Retries 10 s apart: one would outlive the lock's 1 s validity.
    let policy = RetryPolicy::default()
        .retries(3)
        .delay(Duration::from_secs(10));
    let (proxies, locks) = through_proxies(&nodes, policy);
    let ttl = Duration::from_secs(1);
    let mut lock = locks.acquire("r", ttl).unwrap();
    for proxy in &proxies {
        proxy.set_fault(Fault::Partition);
    }
    let start = Instant::now();
    let result = locks.extend(&mut lock, ttl);
    assert!(
        matches!(result, Err(LockError::NoQuorum { .. })),
        "{result:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "extend slept a retry pause past the lock's validity: {:?}",
        start.elapsed()
    );
}

#[test]
fn an_extension_too_few_answered_is_retried_while_the_validity_lasts() {
    let nodes = cluster(3);
    let policy = RetryPolicy::default()
        .retries(50)
        .delay(Duration::from_millis(50));
    let (proxies, locks) = through_proxies(&nodes, policy);
    let ttl = Duration::from_secs(10);
    let mut lock = locks.acquire("r", ttl).unwrap();
    for proxy in &proxies[..2] {
        proxy.set_fault(Fault::Partition);
    }
    let heal = thread::spawn(move || {
        thread::sleep(Duration::from_millis(600));
        for proxy in &proxies {
            proxy.set_fault(Fault::None);
        }
        proxies
    });
    let result = locks.extend(&mut lock, ttl);
    let _proxies = heal.join().unwrap();
    assert!(
        result.is_ok(),
        "not retried until the partition healed: {result:?}"
    );
    locks.release(lock).unwrap();
}
