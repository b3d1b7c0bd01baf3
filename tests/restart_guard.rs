//! The restarted-node guard: a node that restarted without persistence has
//! forgotten its locks; without the guard it hands out a lock that is still
//! held, with it the node does not vote until its grace period has passed.

mod common;

use std::time::{Duration, Instant};

use common::{builder, cluster, holders, wait_until, SETTLE};
use redlock_sync::{Lock, LockError, NodeError, NodeOutcome, Redlock, RetryPolicy};
use redlock_sync_testing::Cluster;

/// Client A holds `resource` for `ttl` on exactly a bare quorum (nodes 0
/// and 1 of 3), then node 0 restarts without persistence and forgets it.
/// Returns A's lock and the instant just before node 0 was restarted.
fn hold_on_a_bare_quorum_then_restart_node_0(
    nodes: &Cluster,
    resource: &str,
    ttl: Duration,
) -> (Lock, Instant) {
    let a = builder(nodes).build().unwrap();
    // Node 2 is held by someone else while A acquires ...
    nodes
        .node(2)
        .query(&["SET", resource, "someone-else", "PX", "60000"])
        .unwrap();
    let lock = a.try_acquire(resource, ttl).expect("nodes 0 and 1 grant A");
    assert_eq!(holders(nodes, &lock), 2, "A holds nodes 0 and 1");
    // ... who then lets go of it.
    nodes.node(2).query(&["DEL", resource]).unwrap();
    // Node 0 restarts without persistence: A's key there is gone.
    let restarting = Instant::now();
    nodes.node(0).restart().unwrap();
    assert_eq!(nodes.node(0).get(resource).unwrap(), None);
    assert_eq!(holders(nodes, &lock), 1, "only node 1 still holds A's lock");
    (lock, restarting)
}

fn restarted(outcome: &NodeOutcome) -> bool {
    matches!(outcome, NodeOutcome::Failed(NodeError::Restarted { .. }))
}

#[test]
fn without_the_guard_a_node_restarted_without_persistence_lets_a_second_client_win_a_held_lock() {
    let nodes = cluster(3);
    let (held, _) =
        hold_on_a_bare_quorum_then_restart_node_0(&nodes, "hazard", Duration::from_secs(30));
    let b = builder(&nodes).build().unwrap();
    let stolen = b
        .try_acquire("hazard", Duration::from_secs(30))
        .expect("the hazard: nodes 0 and 2 grant B although A still holds the lock");
    assert!(
        held.is_valid() && stolen.is_valid(),
        "expected both A and B to hold the lock at once (the hazard the guard prevents), got A valid {} and B valid {}",
        held.is_valid(),
        stolen.is_valid()
    );
    assert_eq!(stolen.report().granted(), 2, "{}", stolen.report());
}

#[test]
fn with_the_guard_a_restarted_node_does_not_vote_until_its_uptime_reaches_the_grace() {
    const TTL: Duration = Duration::from_secs(1);
    let nodes = cluster(3);
    let b = builder(&nodes).restart_grace(TTL).build().unwrap();
    // The fresh nodes vote once they have been up for the grace period.
    // (A node the guard keeps out fails at connect, before any reply is
    // read, so it shows as failed in every report until it votes.)
    wait_until(Duration::from_secs(5), "every node votes", || {
        b.try_acquire("warm-up", TTL)
            .and_then(|lock| b.release(lock))
            .is_ok_and(|report| {
                report
                    .nodes
                    .iter()
                    .all(|n| !matches!(n.outcome, NodeOutcome::Failed(_) | NodeOutcome::TimedOut))
            })
    });
    let (held, restarted_at) = hold_on_a_bare_quorum_then_restart_node_0(&nodes, "guarded", TTL);

    // B's pooled connection to node 0 died with the old process (the first
    // attempt may see that); any new connection finds a fresh node.
    for attempt in 1..=2 {
        match b.try_acquire("guarded", TTL) {
            Err(LockError::Contended { report, .. }) => {
                let node_0 = &report.nodes[0].outcome;
                assert!(
                    restarted(node_0) || (attempt == 1 && matches!(node_0, NodeOutcome::Failed(NodeError::Io(_)))),
                    "attempt {attempt}: expected node 0 to be kept out as restarted, got {report}"
                );
                assert_eq!(report.nodes[1].outcome, NodeOutcome::Refused, "{report}");
                // Node 2 grants, unless the round was decided (node 0 out,
                // node 1 refused) before its reply was read.
                assert!(
                    matches!(
                        report.nodes[2].outcome,
                        NodeOutcome::Granted | NodeOutcome::NotAwaited
                    ),
                    "{report}"
                );
            }
            other => panic!(
                "attempt {attempt}: expected the contended error while A holds the lock, got {other:?}"
            ),
        }
    }
    assert!(held.is_valid(), "A's lock outlived B's attempt");

    // B keeps trying, until node 0 grants again. B must not win while A's
    // lock is valid, and node 0 must not grant before the grace has passed
    // since its restart.
    let mut node_0_voted = false;
    wait_until(Duration::from_secs(8), "node 0 votes again", || {
        let result = b.try_acquire("guarded", TTL);
        let now = Instant::now();
        let report = match &result {
            Ok(lock) => lock.report().clone(),
            Err(e) => e.report().expect("a round ran").clone(),
        };
        if report.nodes[0].outcome == NodeOutcome::Granted {
            assert!(
                now - restarted_at >= TTL,
                "node 0 granted {:?} after its restart, before the grace of {TTL:?}: {report}",
                now - restarted_at
            );
            node_0_voted = true;
        }
        if let Ok(lock) = result {
            assert!(
                now >= held.valid_until(),
                "B won {:?} before A's validity ended: {report}",
                held.valid_until() - now
            );
            b.release(lock).unwrap();
        }
        node_0_voted
    });
}

#[test]
fn the_guard_reads_the_uptime_with_the_handshake_also_behind_a_password_and_a_db() {
    let nodes = cluster(3);
    for node in nodes.nodes() {
        node.query(&["CONFIG", "SET", "requirepass", "s3cret"])
            .unwrap();
    }
    let urls: Vec<String> = nodes
        .nodes()
        .iter()
        .map(|n| format!("redis://:s3cret@127.0.0.1:{}/3", n.port().unwrap()))
        .collect();
    // A freshly started node is kept out for the grace period.
    let fresh = Redlock::builder(&urls)
        .retry_policy(RetryPolicy::default().retries(0))
        .restart_grace(Duration::from_secs(3600))
        .build()
        .unwrap();
    match fresh.acquire("r", Duration::from_secs(5)) {
        Err(LockError::NoQuorum { report, .. }) => {
            assert!(
                report.nodes.iter().all(|n| restarted(&n.outcome)),
                "expected every node kept out, got {report}"
            );
        }
        other => panic!("expected the quorum error, got {other:?}"),
    }
    // A short grace: the nodes vote once their uptime shows it has passed,
    // and AUTH and SELECT still apply.
    // (Roomy timeouts: a node whose handshake a busy machine delays past
    // the default 50 ms would get no command at all.)
    let guarded = Redlock::builder(&urls)
        .restart_grace(Duration::from_millis(1))
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    wait_until(Duration::from_secs(5), "the nodes vote", || {
        guarded
            .try_acquire("r", Duration::from_secs(5))
            .map(|lock| guarded.release(lock).unwrap())
            .is_ok()
    });
    let lock = guarded.acquire("r", Duration::from_secs(5)).unwrap();
    assert!(lock.report().granted() >= 2, "{}", lock.report());
    let token = lock.token().to_string();
    let held_in_db3 = |url: &String| {
        let mut con = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(1))
            .unwrap();
        let held: Option<String> = redis::cmd("GET").arg("r").query(&mut con).unwrap();
        held.as_deref() == Some(token.as_str())
    };
    // The command went to every node; a node past the quorum may apply it
    // just after the round was decided.
    wait_until(SETTLE, "every node holds the lock in db 3", || {
        urls.iter().all(held_in_db3)
    });
    guarded.release(lock).unwrap();
}
