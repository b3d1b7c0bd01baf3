//! Fenced acquisitions: tokens that grow with every successful acquisition,
//! counters that persist on the nodes, and a second round that makes the
//! largest counter known to a quorum.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::{
    client, cluster, contending_client, fenced, holders, values, wait_until, wait_until_gone,
    SETTLE,
};
use redlock_sync::{fence_key, ArgumentError, LockError, NodeError, NodeOutcome};

const TTL: Duration = Duration::from_secs(10);

/// The counter each node holds for `resource` (None where missing or down).
fn counters(nodes: &redlock_sync_testing::Cluster, resource: &str) -> Vec<Option<u64>> {
    values(nodes, &fence_key(resource))
        .into_iter()
        .map(|v| v.map(|v| v.parse().expect("a counter is a number")))
        .collect()
}

#[test]
fn threads_recording_their_fencing_token_under_the_lock_see_them_strictly_increase() {
    const THREADS: usize = 8;
    const SECTIONS: usize = 40;
    let nodes = cluster(5);
    let locks = contending_client(&nodes);
    // The log is appended to inside the critical section, so its order is
    // the order in which the sections ran.
    let log = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..SECTIONS {
                    let lock = locks
                        .acquire("fenced-counter", fenced(TTL))
                        .expect("acquire eventually succeeds");
                    let token = lock.fencing_token().expect("a fenced lock has a token");
                    log.lock().unwrap().push(token);
                    std::thread::yield_now();
                    assert!(lock.is_valid(), "the section ended within the validity");
                    locks.release(lock).expect("release of a held lock");
                }
            });
        }
    });
    let log = log.into_inner().unwrap();
    assert_eq!(log.len(), THREADS * SECTIONS);
    for (i, pair) in log.windows(2).enumerate() {
        assert!(
            pair[0] < pair[1],
            "section {} got token {} after section {} got {}: expected strictly increasing",
            i + 1,
            pair[1],
            i,
            pair[0]
        );
    }
}

#[test]
fn a_fenced_lock_leaves_a_counter_that_never_expires_and_extends_and_releases_like_any_lock() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let mut lock = locks.acquire("invoice:7", fenced(TTL)).unwrap();
    let token = lock.fencing_token().expect("a fenced lock has a token");
    // Round two stops at a quorum of confirmations; the others land just
    // after.
    assert!(lock.report().granted() >= 3, "{}", lock.report());
    assert_eq!(holders(&nodes, &lock), 5, "every node holds the lock");
    wait_until(
        SETTLE,
        "round two left every node's counter at the token",
        || counters(&nodes, "invoice:7") == vec![Some(token); 5],
    );
    for node in nodes.nodes() {
        assert_eq!(node.pttl(&fence_key("invoice:7")).unwrap(), -1, "no expiry");
    }

    locks.extend(&mut lock, TTL).unwrap();
    assert_eq!(lock.fencing_token(), Some(token), "extend keeps the token");
    locks.release(lock).unwrap();
    wait_until_gone(&nodes, "invoice:7", SETTLE);
    assert_eq!(
        counters(&nodes, "invoice:7"),
        vec![Some(token); 5],
        "the counter outlives the lock"
    );

    let next = locks.acquire("invoice:7", fenced(TTL)).unwrap();
    let next_token = next.fencing_token().unwrap();
    assert!(
        next_token > token,
        "expected more than {token}, got {next_token}"
    );
    locks.release(next).unwrap();

    // Plain locks have no token, and plain and fenced locks exclude each other.
    let plain = locks.acquire("invoice:7", TTL).unwrap();
    assert_eq!(plain.fencing_token(), None);
    match locks.try_acquire("invoice:7", fenced(TTL)) {
        Err(LockError::Contended { report, .. }) => assert_eq!(report.refused(), 5, "{report}"),
        other => panic!("expected the contended error, got {other:?}"),
    }
    locks.release(plain).unwrap();
}

#[test]
fn round_two_spreads_the_largest_counter_so_a_later_quorum_without_its_node_still_goes_higher() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    // Node 0 alone has a counter far above the others (it saw acquisitions
    // the others missed).
    let high: u64 = 5_000_000_000_000_000;
    nodes
        .node(0)
        .set(&fence_key("spread"), &high.to_string())
        .unwrap();
    let lock = locks.acquire("spread", fenced(TTL)).unwrap();
    let first = lock.fencing_token().unwrap();
    assert_eq!(first, high + 1, "the token is the largest counter");
    locks.release(lock).unwrap();
    assert_eq!(counters(&nodes, "spread"), vec![Some(high + 1); 5]);

    // Without node 0, the other four still know the high value.
    nodes.node(0).kill().unwrap();
    let lock = locks.acquire("spread", fenced(TTL)).unwrap();
    let second = lock.fencing_token().unwrap();
    assert!(second > first, "expected more than {first}, got {second}");
    locks.release(lock).unwrap();
}

#[test]
fn counters_lost_with_a_restart_start_again_from_the_clock_above_every_earlier_token() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let lock = locks.acquire("amnesia", fenced(TTL)).unwrap();
    let before = lock.fencing_token().unwrap();
    locks.release(lock).unwrap();
    for node in nodes.nodes() {
        node.restart().unwrap();
    }
    assert_eq!(
        counters(&nodes, "amnesia"),
        vec![None; 3],
        "all counters lost"
    );
    let lock = locks.acquire("amnesia", fenced(TTL)).unwrap();
    let after = lock.fencing_token().unwrap();
    assert!(
        after > before,
        "expected more than {before} after every node lost its counter, got {after}"
    );
    locks.release(lock).unwrap();
}

#[test]
fn a_node_whose_counter_is_not_a_number_fails_without_setting_the_lock_and_the_rest_grant() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    nodes
        .node(0)
        .set(&fence_key("garbled"), "not a number")
        .unwrap();
    let lock = locks.acquire("garbled", fenced(TTL)).unwrap();
    let report = lock.report();
    assert!(report.granted() >= 3, "{report}");
    assert!(
        matches!(
            &report.nodes[0].outcome,
            NodeOutcome::Failed(NodeError::Server(_))
        ),
        "expected node 0 to fail with a server error, got {}",
        report.nodes[0].outcome
    );
    assert_eq!(
        nodes.node(0).get("garbled").unwrap(),
        None,
        "the script failed before it set the lock"
    );
    locks.release(lock).unwrap();
}

#[test]
fn an_acquisition_of_a_counter_key_fenced_or_not_is_refused() {
    let nodes = cluster(1);
    let locks = client(&nodes);
    fn reserved<T: std::fmt::Debug>(result: Result<T, LockError>) {
        match result {
            Err(LockError::Argument(ArgumentError::ReservedResource(name))) => {
                assert_eq!(name, fence_key("x"))
            }
            other => panic!("expected the reserved-resource error, got {other:?}"),
        }
    }
    reserved(locks.try_acquire(fence_key("x"), fenced(TTL)));
    reserved(locks.try_acquire(fence_key("x"), TTL));
    reserved(locks.acquire(["y".to_string(), fence_key("x")], TTL));
    reserved(locks.with_lock(fence_key("x"), TTL, |_| Ok::<_, LockError>(())));
    reserved(locks.try_lock(fence_key("x"), TTL));
    assert!(nodes.node(0).keys().unwrap().is_empty(), "nothing written");
}

#[test]
fn a_failed_fenced_acquisition_releases_the_lock_but_keeps_the_counter() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    // Two of three nodes are held by someone else: no quorum.
    for i in [1, 2] {
        nodes
            .node(i)
            .query(&["SET", "busy", "someone-else", "PX", "60000"])
            .unwrap();
    }
    match locks.acquire("busy", fenced(TTL)) {
        Err(LockError::Contended {
            attempts, report, ..
        }) => {
            assert_eq!(attempts, 4);
            assert_eq!(report.refused(), 2, "{report}");
        }
        other => panic!("expected the contended error, got {other:?}"),
    }
    assert_eq!(
        values(&nodes, "busy"),
        vec![
            None,
            Some("someone-else".into()),
            Some("someone-else".into())
        ],
        "our key was released on node 0, the other holder's left alone"
    );
    assert!(
        counters(&nodes, "busy")[0].is_some(),
        "the counter node 0 raised stays"
    );
}
