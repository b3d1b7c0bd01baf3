//! Shared holders at scale: a call's work on a node is the expired members
//! it purges plus a logarithm of the holders (each holder is found by its
//! token, not by a scan), and `inspect` lists the first 100 holders with
//! their count, so it answers at 10,000 readers within a status's timeout.

mod common;

use std::time::Duration;

use common::{builder, cluster};
use redlock_sync::{Kind, LockOptions, Verdict};
use redlock_sync_testing::Node;

const TTL: Duration = Duration::from_secs(60);

/// The node's clock in ms.
fn node_now_ms(node: &Node) -> u64 {
    let time: Vec<u64> = redis::from_redis_value(node.query(&["TIME"]).unwrap()).unwrap();
    time[0] * 1000 + time[1] / 1000
}

/// Adds readers to `resource` on `node` until it has `total`, as a client
/// of this crate leaves them: a token each, scored by its expiry, beside
/// the readers' marker.
fn fill(node: &Node, resource: &str, from: usize, total: usize) {
    let until = (node_now_ms(node) + 600_000).to_string();
    // Tokens that differ in their first 8 digits, as random ones do.
    let token = |i: usize| {
        let spread = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!("{spread:016x}{i:024x}")
    };
    let tokens: Vec<String> = (from..total).map(token).collect();
    let mut args = vec!["ZADD", resource, "-inf", "redlock-sync:2:kind=0"];
    for token in &tokens {
        args.push(&until);
        args.push(token);
    }
    node.query(&args).unwrap();
    node.query(&["PEXPIREAT", resource, &until]).unwrap();
}

/// The shared script's mean time per call on `node`, in µs, since the
/// last `CONFIG RESETSTAT`.
fn usec_per_call(node: &Node) -> f64 {
    let info = match node.query(&["INFO", "commandstats"]).unwrap() {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO commandstats: {other:?}"),
    };
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
    let line = line.expect("EVALSHA calls");
    let field = line
        .split(',')
        .find_map(|f| f.strip_prefix("usec_per_call="));
    field.expect("usec_per_call").parse().unwrap()
}

/// 200 readers join and leave `resource`; the script's time per call.
fn time_calls(locks: &redlock_sync::Redlock, node: &Node, resource: &str) -> f64 {
    node.query(&["CONFIG", "RESETSTAT"]).unwrap();
    let shared = LockOptions::new(TTL).kind(Kind::Shared).owner("scale");
    for _ in 0..200 {
        let lock = locks.acquire(resource, &shared).expect("a reader");
        locks.release(lock).expect("release");
    }
    usec_per_call(node)
}

#[test]
fn a_shared_call_at_10000_holders_costs_within_twice_its_cost_at_100() {
    let nodes = cluster(1);
    let node = nodes.node(0);
    let locks = builder(&nodes).build().unwrap();
    // Warm up: the connection and the scripts.
    time_calls(&locks, node, "warm-up");
    fill(node, "crowd", 0, 100);
    let at_100 = time_calls(&locks, node, "crowd");
    fill(node, "crowd", 100, 10_000);
    let at_10000 = time_calls(&locks, node, "crowd");
    println!("shared script per call: {at_100:.1} µs at 100 holders, {at_10000:.1} µs at 10,000");
    assert!(
        at_10000 <= 2.0 * at_100.max(5.0),
        "{at_10000:.1} µs at 10,000 holders against {at_100:.1} µs at 100"
    );
}

#[test]
fn inspect_at_10000_readers_lists_100_with_the_count_within_50_ms() {
    let nodes = cluster(3);
    for node in nodes.nodes() {
        fill(node, "crowd", 0, 10_000);
    }
    let locks = builder(&nodes)
        .io_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    // The best of three: a busy machine may stall one round.
    let verdicts: Vec<Verdict> = (0..3)
        .map(|_| locks.inspect("crowd").unwrap().verdict())
        .collect();
    let shared = verdicts.iter().find_map(|v| match v {
        Verdict::Shared { holders, count, .. } => Some((holders.len(), *count)),
        _ => None,
    });
    assert_eq!(shared, Some((100, 10_000)), "{verdicts:?}");
}
