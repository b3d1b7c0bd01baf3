//! Node failures: killed nodes, a paused (SIGSTOP) node, and what the
//! client does about late replies.

mod common;

use std::time::{Duration, Instant};

use common::{
    builder, cluster, holders, no_quorum_within, values, wait_until, wait_until_gone, SETTLE,
};
use redlock_sync::{Kind, Lock, LockError, NodeOutcome, Redlock, RetryPolicy};

const TTL: Duration = Duration::from_secs(10);
const IO_TIMEOUT: Duration = Duration::from_millis(100);
const RETRY_DELAY: Duration = Duration::from_millis(10);
const RETRY_JITTER: Duration = Duration::from_millis(10);
const RETRY_COUNT: u32 = 3;

#[test]
fn a_minority_of_dead_nodes_does_not_stop_acquire_but_a_majority_gives_the_quorum_error_in_bounded_time(
) {
    let nodes = cluster(5);
    let locks = builder(&nodes)
        .retry_policy(
            RetryPolicy::default()
                .retries(RETRY_COUNT)
                .delay(RETRY_DELAY)
                .jitter(RETRY_JITTER),
        )
        .io_timeout(IO_TIMEOUT)
        .build()
        .unwrap();
    // Warm the pool, so that the dead nodes' connections are stale ones.
    locks.release(locks.acquire("warm", TTL).unwrap()).unwrap();

    nodes.node(0).kill().unwrap();
    nodes.node(1).kill().unwrap();
    let lock = locks
        .acquire("two-dead", TTL)
        .expect("3 of 5 nodes are a quorum");
    assert_eq!(holders(&nodes, &lock), 3);
    let report = locks.release(lock).expect("release on the live quorum");
    assert_eq!(report.granted(), 3, "{report}");
    // A round that the live quorum decided may leave a dead node unread
    // (`NotAwaited`: the nodes are read in turn, the late ones last); the
    // first round that reads it finds the connection gone and reports the
    // node failed, and the ones after fail to connect. A round reads a
    // node at the latest once it has 32 unread replies.
    let mut failed = matches!(report.nodes[0].outcome, NodeOutcome::Failed(_));
    for i in 0..40 {
        if failed {
            break;
        }
        let lock = locks
            .acquire(format!("two-dead:{i}"), TTL)
            .expect("3 of 5 nodes are a quorum");
        let report = locks.release(lock).expect("release on the live quorum");
        assert!(
            matches!(
                report.nodes[0].outcome,
                NodeOutcome::Failed(_) | NodeOutcome::NotAwaited
            ),
            "a dead node is failed or unread, never granted: {report}"
        );
        failed = matches!(report.nodes[0].outcome, NodeOutcome::Failed(_));
    }
    assert!(
        failed,
        "a dead node is reported as failed once a round reads it"
    );

    nodes.node(2).kill().unwrap();
    let bound =
        (IO_TIMEOUT + RETRY_DELAY + RETRY_JITTER) * (RETRY_COUNT + 1) + Duration::from_millis(250);
    let report = no_quorum_within(&locks, "three-dead", TTL, RETRY_COUNT + 1, bound);
    assert_eq!(report.failed(), 3, "{report}");
    wait_until(SETTLE, "failed attempts released the live nodes", || {
        values(&nodes, "three-dead")[3..] == [None, None]
    });
}

#[test]
fn a_paused_node_costs_at_most_the_io_timeout_and_its_late_replies_are_never_taken() {
    let nodes = cluster(5);
    let locks = builder(&nodes).io_timeout(IO_TIMEOUT).build().unwrap();
    // Warm the pool: node 0's idle connections must be dropped, not reused.
    for i in 0..4 {
        let lock = locks.acquire(format!("warm-{i}"), TTL).unwrap();
        locks.release(lock).unwrap();
    }

    nodes.node(0).pause().unwrap();
    for i in 0..5 {
        let resource = format!("paused-{i}");
        let lock = locks.acquire(&resource, TTL).expect("4 of 5 nodes answer");
        let report = lock.report().clone();
        // Timed out, or not awaited, or (once a connect to it timed out)
        // failed at once while the client backs off reconnecting: never an
        // answer.
        assert!(
            !matches!(
                report.nodes[0].outcome,
                NodeOutcome::Granted | NodeOutcome::Refused
            ),
            "{report}"
        );
        assert!(report.granted() >= 3, "{report}");
        assert!(
            report.elapsed <= IO_TIMEOUT + Duration::from_millis(100),
            "a round with a hung node took {:?}, more than io_timeout {IO_TIMEOUT:?}",
            report.elapsed
        );
        locks.release(lock).unwrap();
    }
    nodes.node(0).resume().unwrap();
    // Once its reconnect backoff is over, node 0 is asked again.
    wait_until(Duration::from_secs(5), "node 0 is connected again", || {
        let lock = locks.acquire("reconnect", TTL).unwrap();
        let back = matches!(
            lock.report().nodes[0].outcome,
            NodeOutcome::Granted | NodeOutcome::NotAwaited
        );
        locks.release(lock).unwrap();
        back
    });

    // Node 0 now executes the commands it had queued and answers them on
    // connections that were dropped. None of those replies may be read as
    // the answer to a later command: each reported outcome must match what
    // the node really holds.
    for i in 0..200 {
        let resource = format!("after-{}", i % 7);
        let lock = locks.acquire(&resource, TTL).expect("all nodes are up");
        let token = lock.token().to_string();
        for (node, entry) in nodes.nodes().iter().zip(&lock.report().nodes) {
            let held = node.get(&resource).unwrap();
            match entry.outcome {
                NodeOutcome::Granted => assert_eq!(
                    held.as_deref(),
                    Some(token.as_str()),
                    "cycle {i}: {} reported granted but holds {held:?}",
                    entry.node
                ),
                NodeOutcome::Refused => assert_ne!(
                    held.as_deref(),
                    Some(token.as_str()),
                    "cycle {i}: {} holds our token but reported refused",
                    entry.node
                ),
                // Not awaited, timed out, failed: no claim to check.
                _ => {}
            }
        }
        let report = locks.release(lock).expect("release");
        for (node, entry) in nodes.nodes().iter().zip(&report.nodes) {
            assert!(
                matches!(
                    entry.outcome,
                    NodeOutcome::Granted | NodeOutcome::NotAwaited
                ),
                "cycle {i}: {} did not release: {report}",
                entry.node
            );
            if entry.outcome == NodeOutcome::Granted {
                assert_eq!(
                    node.get(&resource).unwrap(),
                    None,
                    "cycle {i}: {}",
                    entry.node
                );
            }
        }
        wait_until_gone(&nodes, &resource, SETTLE);
    }
}

#[test]
fn connecting_to_a_paused_node_gives_up_at_the_connect_timeout_not_the_io_timeout() {
    let nodes = cluster(3);
    // The kernel accepts the TCP connection of a stopped process, so the
    // connect itself succeeds; its handshake (SCRIPT LOAD, INFO) is what
    // never gets an answer, and it must end at the connect timeout.
    nodes.node(2).pause().unwrap();
    let connect_timeout = Duration::from_millis(100);
    let io_timeout = Duration::from_secs(2);
    let locks = builder(&nodes)
        .connect_timeout(connect_timeout)
        .io_timeout(io_timeout)
        .build()
        .unwrap();
    let lock = locks
        .acquire("handshake", TTL)
        .expect("2 of 3 nodes answer");
    let entry = &lock.report().nodes[2];
    assert_eq!(entry.outcome, NodeOutcome::TimedOut, "{}", lock.report());
    assert!(
        entry.elapsed < io_timeout / 2,
        "the paused node's handshake ran {:?}: past the connect timeout {connect_timeout:?}, \
         towards the io_timeout {io_timeout:?}",
        entry.elapsed
    );
    locks.release(lock).unwrap();
    nodes.node(2).resume().unwrap();
}

#[test]
fn a_fresh_client_whose_first_node_hangs_still_locks_with_default_timeouts() {
    let nodes = cluster(3);
    // Node 0, listed first, accepts TCP connections but never answers. A
    // fresh client has no connections: it connects to every node in its
    // first round, and node 0's connect must not use up the others' time.
    nodes.node(0).pause().unwrap();
    let locks = Redlock::new(nodes.urls()).unwrap();
    for i in 0..10 {
        let lock = locks
            .try_acquire(format!("first-hangs-{i}"), TTL)
            .unwrap_or_else(|e| panic!("attempt {i}: nodes 1 and 2 answer, yet: {e}"));
        assert!(lock.report().granted() >= 2, "{}", lock.report());
        locks.release(lock).unwrap();
    }
    nodes.node(0).resume().unwrap();
}

#[test]
fn a_fresh_client_connects_to_its_nodes_side_by_side() {
    let nodes = cluster(5);
    nodes.node(0).pause().unwrap();
    nodes.node(1).pause().unwrap();
    let connect_timeout = Duration::from_millis(300);
    let locks = builder(&nodes)
        .connect_timeout(connect_timeout)
        .io_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = locks.acquire("side-by-side", TTL).expect("3 of 5 nodes");
    let report = lock.report();
    assert_eq!(report.nodes[0].outcome, NodeOutcome::TimedOut, "{report}");
    assert_eq!(report.nodes[1].outcome, NodeOutcome::TimedOut, "{report}");
    // One after the other, the two hung connects would take twice the
    // connect timeout before the round could read anything.
    assert!(
        report.elapsed < connect_timeout * 2,
        "two hung connects took {:?} together: they ran one after the other \
         (connect timeout {connect_timeout:?})",
        report.elapsed
    );
    locks.release(lock).unwrap();
    nodes.node(0).resume().unwrap();
    nodes.node(1).resume().unwrap();
}

#[test]
fn extend_with_too_few_nodes_stops_retrying_when_the_lock_is_no_longer_valid_or_max_wait_is_used_up(
) {
    let nodes = cluster(3);
    // Retries without limit: only the lock's validity and max_wait end them.
    let retry_forever = |max_wait: Option<Duration>| {
        let mut locks = builder(&nodes)
            .retry_policy(
                RetryPolicy::default()
                    .retries(u32::MAX)
                    .delay(RETRY_DELAY)
                    .jitter(RETRY_JITTER),
            )
            .io_timeout(IO_TIMEOUT);
        if let Some(wait) = max_wait {
            locks = locks.max_wait(wait);
        }
        locks.build().unwrap()
    };
    let by_validity = retry_forever(None);
    let mut short = by_validity
        .acquire("short", Duration::from_millis(800))
        .unwrap();
    let by_budget = retry_forever(Some(Duration::from_millis(300)));
    let mut long = by_budget.acquire("long", TTL).unwrap();
    nodes.node(1).kill().unwrap();
    nodes.node(2).kill().unwrap();

    let valid_until = Instant::now() + short.validity();
    match by_validity.extend(&mut short, Duration::from_secs(10)) {
        Err(LockError::NoQuorum { attempts, .. }) => {
            assert!(attempts > 1, "it retried while the lock was valid")
        }
        // The last retry may start just before the validity ends and end
        // just after it: such a late round counts only renewals, and none
        // came, so the lock is told lost (see `extend`'s docs). Either way
        // it retried up to the validity's end.
        Err(LockError::Lost { .. }) => assert!(
            Instant::now() >= valid_until,
            "told lost while the validity lasted"
        ),
        other => panic!("expected NoQuorum or Lost once the validity was over, got {other:?}"),
    }
    // No retry started after the validity: the last round began before it
    // ended, and a round lasts at most the io_timeout.
    assert!(Instant::now() < valid_until + IO_TIMEOUT + SETTLE);

    let started = Instant::now();
    match by_budget.extend(&mut long, TTL) {
        Err(LockError::NoQuorum { attempts, .. }) => assert!(attempts > 1),
        other => panic!("expected NoQuorum once max_wait was used up, got {other:?}"),
    }
    assert!(
        started.elapsed() < TTL / 2,
        "max_wait (300 ms) ended the retries, not the lock's validity (10 s)"
    );

    // A lock rebuilt from its token has no validity known here: the retry
    // count bounds its retries, as before.
    let rebuilt = builder(&nodes)
        .retry_policy(
            RetryPolicy::default()
                .retries(2)
                .delay(RETRY_DELAY)
                .jitter(RETRY_JITTER),
        )
        .io_timeout(IO_TIMEOUT)
        .build()
        .unwrap();
    let mut from_token = Lock::from_token("long", *long.token(), Kind::Plain).unwrap();
    match rebuilt.extend(&mut from_token, TTL) {
        Err(LockError::NoQuorum { attempts, .. }) => assert_eq!(attempts, 3),
        other => panic!("expected NoQuorum after 2 retries, got {other:?}"),
    }
}
