//! Beside an older client of this crate (layout 1: the side keys without a
//! hash tag, holders' members `TOKEN[ OWNER]` and their kind in
//! `redlock-sync:kind:R`): plain and fenced locks still exclude each other
//! both ways, neither client joins the other's holders' set, and fencing
//! tokens keep rising across the upgrade.

mod common;

use std::time::Duration;

use common::{client, cluster};
use redlock_sync::{Kind, LockError, LockOptions, NodeError, NodeOutcome};
use redlock_sync_testing::{Cluster, Node};

const TTL: Duration = Duration::from_secs(10);

/// The older client's shared and counted script.
const OLDER_SHARED: &str = include_str!("data/older_shared.lua");

/// An older client's token, as it stored it.
const OLDER_TOKEN: &str = "0123456789abcdef0123456789abcdef01234567";

/// The node's clock in ms.
fn node_now_ms(node: &Node) -> u64 {
    let time: Vec<u64> = redis::from_redis_value(node.query(&["TIME"]).unwrap()).unwrap();
    time[0] * 1000 + time[1] / 1000
}

/// The older client's script on `node`: `op` on `resource` for `member`
/// with kind `k`; its reply.
fn older_shared(node: &Node, op: &str, resource: &str, member: &str, k: &str) -> redis::Value {
    let intent = format!("redlock-sync:intent:{resource}");
    let kind = format!("redlock-sync:kind:{resource}");
    let args = [
        "EVAL",
        OLDER_SHARED,
        "3",
        resource,
        &intent,
        &kind,
        op,
        member,
        "10000",
        k,
    ];
    node.query(&args).expect("the older script runs")
}

fn dumps(nodes: &Cluster, key: &str) -> Vec<redis::Value> {
    let dump = |node: &Node| node.query(&["DUMP", key]).unwrap();
    nodes.nodes().iter().map(dump).collect()
}

#[test]
fn plain_and_fenced_locks_exclude_an_older_clients_both_ways() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    // The older client holds: its key is the resource, as ours is.
    for node in nodes.nodes() {
        node.query(&["SET", "ledger", OLDER_TOKEN, "NX", "PX", "10000"])
            .unwrap();
    }
    for options in [
        LockOptions::new(TTL),
        LockOptions::new(TTL).kind(Kind::Fenced),
    ] {
        let result = locks.try_acquire("ledger", options);
        assert!(
            matches!(result, Err(LockError::Contended { .. })),
            "{result:?}"
        );
    }
    // We hold: the older client's SET NX fails.
    let lock = locks.try_acquire("books", TTL).expect("free");
    for node in nodes.nodes() {
        let set = node.query(&["SET", "books", OLDER_TOKEN, "NX", "PX", "10000"]);
        assert_eq!(set.unwrap(), redis::Value::Nil);
    }
    locks.release(lock).unwrap();
}

#[test]
fn a_new_reader_refuses_an_older_clients_set_and_names_its_version() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    for node in nodes.nodes() {
        let reply = older_shared(
            node,
            "acquire",
            "catalog",
            &format!("{OLDER_TOKEN} old"),
            "0",
        );
        assert_eq!(reply, redis::Value::Int(1), "the older reader is admitted");
    }
    let before = dumps(&nodes, "catalog");
    for options in [
        LockOptions::new(TTL).kind(Kind::Shared),
        LockOptions::new(TTL).kind(Kind::Semaphore(2)),
    ] {
        match locks.try_acquire("catalog", options) {
            Err(LockError::Unusable { report, .. }) => {
                for node in &report.nodes {
                    let version = match &node.outcome {
                        NodeOutcome::Failed(NodeError::OtherVersion(version)) => version,
                        other => panic!("{other:?}"),
                    };
                    assert_eq!(version, "layout 1");
                }
            }
            other => panic!("expected another version's refusal, got {other:?}"),
        }
    }
    let writer = locks.try_acquire("catalog", TTL);
    assert!(
        matches!(writer, Err(LockError::Contended { .. })),
        "{writer:?}"
    );
    assert_eq!(
        dumps(&nodes, "catalog"),
        before,
        "the older set was written"
    );
}

#[test]
fn an_older_reader_sees_a_new_set_as_held_by_another_and_leaves_it_alone() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let reader = locks
        .acquire("catalog", LockOptions::new(TTL).kind(Kind::Shared))
        .expect("a new reader");
    let before = dumps(&nodes, "catalog");
    for node in nodes.nodes() {
        for k in ["0", "2"] {
            let reply = older_shared(node, "acquire", "catalog", OLDER_TOKEN, k);
            assert_eq!(reply, redis::Value::Int(0), "held by another");
        }
    }
    assert_eq!(
        dumps(&nodes, "catalog"),
        before,
        "the older client wrote it"
    );
    locks.release(reader).expect("the new reader leaves");
}

#[test]
fn fenced_tokens_rise_across_the_upgrade_from_the_nodes_clock() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    // The older client's last token, a second ago: its counter, under the
    // older key name, followed the node's clock in µs too.
    let older = (node_now_ms(nodes.node(0)) - 1_000) * 1_000;
    for node in nodes.nodes() {
        node.set("redlock-sync:fence:ledger", &older.to_string())
            .unwrap();
    }
    let fenced = LockOptions::new(TTL).kind(Kind::Fenced);
    let lock = locks.acquire("ledger", fenced).expect("a fenced lock");
    let token = lock.fencing_token().expect("a token");
    assert!(token > older, "{token} after the older client's {older}");
    locks.release(lock).unwrap();
}
