//! Helpers shared by the integration tests: real nodes, clients with quick
//! retry settings, and checks of what the nodes hold.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use redlock_sync::{
    Kind, Lock, LockError, LockOptions, Redlock, RedlockBuilder, Report, RetryPolicy,
};
use redlock_sync_testing::Cluster;

/// How long a test waits for what a decided round left in flight (replies
/// past the quorum, fire-and-forget clean-up) to land on the nodes.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Starts `n` throwaway redis-server nodes, or fails the test saying why
/// (for instance that redis-server is not installed, and how to install it).
pub fn cluster(n: usize) -> Cluster {
    Cluster::start(n).unwrap_or_else(|e| panic!("could not start {n} redis-server nodes: {e}"))
}

/// A builder over the cluster's nodes with short, test-friendly pauses, and
/// an I/O timeout roomy enough that a busy 2-core CI machine does not fail
/// a healthy node (tests about timeouts set their own).
pub fn builder(cluster: &Cluster) -> RedlockBuilder {
    builder_over(cluster.urls())
}

/// [`builder`] over these node URLs.
pub fn builder_over(urls: Vec<String>) -> RedlockBuilder {
    Redlock::builder(urls)
        .retry_policy(quick_retries(3))
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
}

/// `retries` retries, 10 to 20 ms apart: the tests' usual pace.
pub fn quick_retries(retries: u32) -> RetryPolicy {
    let pace = Duration::from_millis(10);
    RetryPolicy::default()
        .retries(retries)
        .delay(pace)
        .jitter(pace)
}

/// A client over the cluster's nodes with short, test-friendly pauses.
pub fn client(cluster: &Cluster) -> Redlock {
    builder(cluster).build().expect("valid test configuration")
}

/// A client for many threads contending for the same locks: it retries
/// after 1 to 4 ms for up to 20 s, so every acquisition succeeds, and a
/// regression whose rounds all fail fails the test in bounded time
/// rather than retrying for hours.
pub fn contending_client(cluster: &Cluster) -> Redlock {
    builder(cluster)
        .retry_policy(
            RetryPolicy::default()
                .retries(10_000)
                .delay(Duration::from_millis(1))
                .jitter(Duration::from_millis(3)),
        )
        .max_wait(Duration::from_secs(20))
        .build()
        .expect("valid test configuration")
}

/// A client whose retries would take minutes (ten-second pauses): a call
/// that returns at once ran a single round.
pub fn slow_retrying_client(cluster: &Cluster) -> Redlock {
    builder(cluster)
        .retry_policy(
            RetryPolicy::default()
                .retries(100)
                .delay(Duration::from_secs(10)),
        )
        .build()
        .expect("valid test configuration")
}

/// Runs `locks.acquire(resource, ttl)`, expecting the quorum error after
/// `attempts` rounds and within `bound`; returns the last round's report.
pub fn no_quorum_within(
    locks: &Redlock,
    resource: &str,
    ttl: Duration,
    attempts: u32,
    bound: Duration,
) -> Report {
    let start = Instant::now();
    let result = locks.acquire(resource, ttl);
    let took = start.elapsed();
    let report = match result {
        Err(LockError::NoQuorum {
            attempts: tried,
            report,
            ..
        }) => {
            assert_eq!(tried, attempts, "attempts: {report}");
            report
        }
        other => panic!("expected the quorum error, got {other:?}"),
    };
    assert!(
        took <= bound,
        "quorum error after {took:?}, expected at most {bound:?}: {report}"
    );
    report
}

/// The value each node holds under `key` (None where missing or unreachable).
pub fn values(cluster: &Cluster, key: &str) -> Vec<Option<String>> {
    cluster
        .nodes()
        .iter()
        .map(|node| node.get(key).ok().flatten())
        .collect()
}

/// How many nodes hold `lock`'s token under each of its resources.
pub fn holders(cluster: &Cluster, lock: &Lock) -> usize {
    let token = lock.token().to_string();
    cluster
        .nodes()
        .iter()
        .filter(|node| {
            lock.resources()
                .iter()
                .all(|r| node.get(r).ok().flatten().as_deref() == Some(token.as_str()))
        })
        .count()
}

/// How many connections listen for releases of `resource` on node `i`.
pub fn listeners(cluster: &Cluster, i: usize, resource: &str) -> i64 {
    let channel = redlock_sync::released_channel(resource);
    match cluster.node(i).query(&["PUBSUB", "NUMSUB", &channel]) {
        Ok(redis::Value::Array(parts)) => match parts.get(1) {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

/// Waits until `cond` holds, polling every few milliseconds; panics with
/// `what` after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls `cond` every few milliseconds for `window`, and fails with `what`
/// the first time it does not hold.
pub fn holds_throughout(window: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < window {
        assert!(
            cond(),
            "expected {what} throughout {window:?}, but not after {:?}",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until no node of the cluster (that is up) holds `key`.
pub fn wait_until_gone(cluster: &Cluster, key: &str, limit: Duration) {
    wait_until(limit, &format!("`{key}` expired on every node"), || {
        values(cluster, key).iter().all(Option::is_none)
    });
}

/// Every key each node holds (`KEYS *`, sorted), in node order.
pub fn keys(cluster: &Cluster) -> Vec<Vec<String>> {
    cluster
        .nodes()
        .iter()
        .map(|node| node.keys().expect("KEYS on a live node"))
        .collect()
}

/// Waits until `n` nodes hold `lock`'s token: a round is decided once a
/// quorum granted, and the other nodes' `SET`s land just after.
pub fn wait_until_held_by(cluster: &Cluster, lock: &Lock, n: usize) {
    wait_until(SETTLE, &format!("{n} nodes hold the lock"), || {
        holders(cluster, lock) == n
    });
}

/// Options for a fenced lock with this TTL.
pub fn fenced(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).kind(Kind::Fenced)
}

/// How many calls of `commands` node `i` has run (`INFO commandstats`,
/// which counts the commands scripts call too).
pub fn calls(cluster: &Cluster, i: usize, commands: &[&str]) -> u64 {
    let info = match cluster.node(i).query(&["INFO", "commandstats"]) {
        Ok(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(redis::Value::VerbatimString { text, .. }) => text,
        other => panic!("INFO commandstats: {other:?}"),
    };
    let calls = |command: &&str| -> u64 {
        (info.lines())
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    commands.iter().map(calls).sum()
}

/// Adds the ACL user `deaf`, without channel rights (Redis 7's default for
/// new users, said explicitly), to `node`; its URL. A client that logs in
/// as it hears no release, as over a proxy that drops them.
pub fn deaf_url(node: &redlock_sync_testing::Node) -> String {
    let setuser = [
        "ACL",
        "SETUSER",
        "deaf",
        "on",
        ">secret",
        "~*",
        "+@all",
        "resetchannels",
    ];
    node.query(&setuser).expect("ACL SETUSER");
    let port = node.port().expect("a TCP node");
    format!("redis://deaf:secret@127.0.0.1:{port}")
}
