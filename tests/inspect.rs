//! `inspect`: what each node holds, and a quorum's verdict, read without
//! writing, through the client's own connections and checks.

mod common;

use std::time::{Duration, Instant};

use common::{builder, builder_over, cluster};
use redlock_sync::{Holding, NodeOutcome, Verdict};

const TTL: Duration = Duration::from_secs(10);

#[test]
fn inspect_tells_free_held_and_partly_held_resources_apart_and_writes_nothing() {
    let started = Instant::now();
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();

    let free = locks.inspect("free").unwrap();
    assert_eq!(free.verdict(), Verdict::Free);
    assert!(free.nodes.iter().all(|n| n.holding == Holding::Free));

    let lock = locks.acquire("held", TTL).unwrap();
    common::wait_until_held_by(&nodes, &lock, 3);
    let held = locks.inspect("held").unwrap();
    let token: String = lock.token().to_string().chars().take(8).collect();
    assert_eq!(
        held.verdict(),
        Verdict::Held {
            token: token.clone(),
            nodes: 3
        }
    );
    for node in &held.nodes {
        match &node.holding {
            Holding::Held(h) => {
                let ttl = h.ttl.expect("a TTL");
                assert_eq!(h.token, token);
                assert!(ttl <= TTL && ttl > TTL / 2, "{ttl:?}");
            }
            other => panic!("{}: {other:?}", node.node),
        }
    }
    let formatted = format!("{held:?}");
    assert!(
        !formatted.contains(&lock.token().to_string()),
        "{formatted}"
    );

    // Partly held: one node holds another token, the others nothing.
    nodes.node(0).set("partly", "0123456789abcdef").unwrap();
    let partly = locks.inspect("partly").unwrap();
    assert_eq!(partly.verdict(), Verdict::Free);
    assert!(
        matches!(&partly.nodes[0].holding, Holding::Held(h) if h.token == "01234567" && h.ttl.is_none())
    );

    // Read-only: no key was written anywhere.
    let keys = common::keys(&nodes);
    assert_eq!(keys[0], ["held", "partly"]);
    assert_eq!(keys[1], ["held"]);
    locks.release(lock).unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn inspect_counts_a_paused_node_as_unknown_within_the_io_timeout() {
    let nodes = cluster(3);
    let io = Duration::from_millis(300);
    let locks = builder(&nodes).io_timeout(io).build().unwrap();
    let lock = locks.acquire("paused", TTL).unwrap();
    common::wait_until_held_by(&nodes, &lock, 3);
    nodes.node(2).pause().unwrap();
    let start = Instant::now();
    let seen = locks.inspect("paused").unwrap();
    assert!(
        start.elapsed() < io + Duration::from_millis(500),
        "took {:?}",
        start.elapsed()
    );
    nodes.node(2).resume().unwrap();
    assert_eq!(
        seen.nodes[2].holding,
        Holding::Unknown(NodeOutcome::TimedOut)
    );
    assert!(matches!(seen.verdict(), Verdict::Held { nodes: 2, .. }));

    // Two of three free and one unknown: free. One held, one free, one
    // unknown: the unknown node may complete a quorum.
    nodes.node(2).pause().unwrap();
    assert_eq!(locks.inspect("nothing").unwrap().verdict(), Verdict::Free);
    nodes.node(0).set("half", "0123456789abcdef").unwrap();
    assert_eq!(locks.inspect("half").unwrap().verdict(), Verdict::Unknown);
    nodes.node(2).resume().unwrap();
}

#[test]
fn inspect_lets_a_server_named_by_two_urls_answer_once() {
    let nodes = cluster(2);
    let port = nodes.node(0).port().unwrap();
    let urls = vec![
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        nodes.node(1).url(),
    ];
    let locks = builder_over(urls).build().unwrap();
    nodes.node(0).set("twice", "0123456789abcdef").unwrap();
    nodes.node(1).set("twice", "0123456789abcdef").unwrap();
    let seen = locks.inspect("twice").unwrap();
    let unknown = (seen.nodes.iter())
        .filter(|n| matches!(n.holding, Holding::Unknown(_)))
        .count();
    assert_eq!(unknown, 1, "{seen:?}");
    // Held on two of the three nodes named, by two servers.
    assert!(
        matches!(seen.verdict(), Verdict::Held { nodes: 2, .. }),
        "{seen:?}"
    );
}
