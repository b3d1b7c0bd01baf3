//! How a round's tally is read when the nodes disagree: an extension that
//! too few nodes answered is "no quorum" (the lock may still be held),
//! never "lost" or "contended", until enough nodes refuse that no quorum
//! can hold it. (From the mutation audit: it pins these boundaries.)
mod common;

use std::time::Duration;

use common::{builder, cluster, wait_until_held_by};
use redlock_sync::{LockError, NodeOutcome, RetryPolicy};

#[test]
fn an_extension_refused_by_one_of_three_with_one_silent_is_no_quorum_not_lost() {
    let nodes = cluster(3);
    let locks = builder(&nodes)
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut lock = locks.acquire("split", Duration::from_secs(30)).unwrap();
    wait_until_held_by(&nodes, &lock, 3);
    let valid_until = lock.valid_until();
    // One node now holds another token, one does not answer, one holds
    // ours: refused by 1 (not more than 3 - 2), so a quorum may still hold
    // it. The round reads every node: it is decided only at its deadline.
    nodes.node(0).set("split", "someone-else").unwrap();
    nodes.node(1).pause().unwrap();
    let extended = locks.extend(&mut lock, Duration::from_secs(30));
    nodes.node(1).resume().unwrap();
    match extended {
        Err(LockError::NoQuorum { report, .. }) => {
            let outcomes: Vec<_> = report.nodes.iter().map(|n| n.outcome.clone()).collect();
            assert_eq!(
                outcomes[..],
                [
                    NodeOutcome::Refused,
                    NodeOutcome::TimedOut,
                    NodeOutcome::Granted
                ],
                "{report:?}"
            );
        }
        other => panic!("expected no quorum, got {other:?}"),
    }
    assert_eq!(
        lock.valid_until(),
        valid_until,
        "a failed extension left the lock as it was"
    );

    // A second refusal rules a quorum out: lost, for good.
    nodes.node(1).set("split", "someone-else").unwrap();
    match locks.extend(&mut lock, Duration::from_secs(30)) {
        Err(LockError::Lost { .. }) => {}
        other => panic!("expected lost, got {other:?}"),
    }
}
