//! The promises of shared and counted locks ([`Kind::Shared`],
//! [`Kind::Semaphore`]) across restarts, and their cost, each tested by
//! name:
//!
//! - on nodes with persistence (`appendonly yes`, `appendfsync always`),
//!   readers and permit holders kept by guards outlive a `kill -9` restart
//!   of every node in turn, and a third permit is refused throughout;
//! - without persistence and without the restart guard, a counted guard is
//!   kept while at most `N - q` nodes lost its member, and told `Lost`
//!   within about one extension interval once more did;
//! - one attempt sends exactly one command to each node, also where the
//!   resource is full or a writer holds it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{builder, calls, client, cluster, wait_until};
use redlock_sync::{Kind, LockError, LockGuard, LockOptions, NodeOutcome, NodeReport, Redlock};
use redlock_sync_testing::{Cluster, Node};

fn shared(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).kind(Kind::Shared)
}

fn permits(k: u32, ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).kind(Kind::Semaphore(k))
}

/// How long the nodes past a quorum may take to apply a decided round's
/// writes: roomy, for a busy machine whose nodes sync every write.
const LANDED: Duration = Duration::from_secs(10);

/// Starts `n` nodes with `appendonly yes` and `appendfsync always`.
fn persistent_cluster(n: usize) -> Cluster {
    Cluster::start_persistent(n)
        .unwrap_or_else(|e| panic!("could not start {n} persistent redis-server nodes: {e}"))
}

/// The score (expiry, node ms) of `guard`'s member on `node`, if it holds
/// one. A member is the token, then an optional owner label.
fn score(node: &Node, guard: &LockGuard) -> Option<f64> {
    let reply = node.query(&["ZRANGE", guard.resource(), "0", "-1", "WITHSCORES"]);
    let flat: Vec<String> = redis::from_redis_value(reply.ok()?).ok()?;
    let token = guard.token().to_string();
    let at = flat.iter().position(|m| m.starts_with(&token))?;
    flat.get(at + 1)?.parse().ok()
}

/// Every loss told to the guards' `on_lost` callbacks: the guard's
/// resource, when, and the error.
type Told = Arc<Mutex<Vec<(String, Instant, String)>>>;

/// Waits until every node answers `locks`, so that its connections are
/// open: a node it cannot reach during an acquisition never gets the
/// holder's member, and these kinds never re-take one.
fn every_node_answers(locks: &Redlock) {
    let ttl = Duration::from_secs(5);
    wait_until(LANDED, "every node answers", || {
        let answered =
            |n: &NodeReport| !matches!(n.outcome, NodeOutcome::Failed(_) | NodeOutcome::TimedOut);
        locks
            .try_acquire("warm-up", ttl)
            .and_then(|lock| locks.release(lock))
            .is_ok_and(|report| report.nodes.iter().all(answered))
    });
}

/// Registers a callback on `guard` that writes its loss into `told`.
fn listen(guard: &LockGuard, told: &Told) {
    let told = Arc::clone(told);
    let resource = guard.resource().to_owned();
    guard.on_lost(move |e| {
        let mut told = told.lock().unwrap_or_else(|p| p.into_inner());
        told.push((resource, Instant::now(), e.to_string()));
    });
}

/// Waits until one attempt of `locks` on `resource` with `options` is
/// refused as contended; panics at once if it is granted. An attempt that
/// too few nodes answered (a busy machine, a connection that died with a
/// restarted node) is tried again.
fn refused(locks: &Redlock, resource: &str, options: LockOptions, what: &str) {
    wait_until(Duration::from_secs(10), what, || {
        match locks.try_acquire(resource, options.clone()) {
            Ok(lock) => panic!("{what}: granted: {}", lock.report()),
            Err(LockError::Contended { .. }) => true,
            Err(_) => false,
        }
    });
}

#[test]
fn readers_and_two_permit_holders_kept_by_guards_are_never_told_lost_across_kill_9_restarts_of_every_persistent_node_and_a_third_permit_is_refused_throughout(
) {
    let ttl = Duration::from_secs(3);
    let nodes = persistent_cluster(5);
    let locks = client(&nodes);
    let other = client(&nodes);
    every_node_answers(&locks);
    every_node_answers(&other);
    let mut guards = Vec::new();
    for _ in 0..2 {
        guards.push(locks.lock("shelf", shared(ttl)).expect("a reader"));
    }
    for _ in 0..2 {
        guards.push(locks.lock("pool", permits(2, ttl)).expect("a permit"));
    }
    let told: Told = Arc::default();
    for guard in &guards {
        listen(guard, &told);
    }
    // A round is decided at its quorum; the other nodes' writes land
    // after.
    wait_until(LANDED, "every node holds every guard", || {
        let holds_all = |n: &Node| guards.iter().all(|g| score(n, g).is_some());
        nodes.nodes().iter().all(holds_all)
    });
    refused(&other, "pool", permits(2, ttl), "a third permit is refused");
    for (i, node) in nodes.nodes().iter().enumerate() {
        let before: Vec<f64> = guards.iter().map(|g| score(node, g).unwrap()).collect();
        node.restart()
            .expect("kill -9, then started again on its port");
        // The node came back with every member it acknowledged.
        for (guard, was) in guards.iter().zip(&before) {
            let now = score(node, guard);
            assert!(
                now.is_some_and(|s| s >= *was),
                "node {i} came back with {now:?} for {}, had {was}",
                guard.resource()
            );
        }
        // Each guard renews its member there again (the client's old
        // connection died with the process: a round reconnects).
        wait_until(
            Duration::from_secs(20),
            &format!("every guard renewed on node {i} after its restart"),
            || {
                let renewed =
                    |(g, was): (&LockGuard, &f64)| score(node, g).is_some_and(|s| s > *was);
                guards.iter().zip(&before).all(renewed)
            },
        );
        for guard in &guards {
            assert!(guard.is_held(), "{} lost after node {i}", guard.resource());
        }
        refused(
            &other,
            "pool",
            permits(2, ttl),
            &format!("a third permit is refused after node {i} restarted"),
        );
        refused(
            &other,
            "shelf",
            LockOptions::new(ttl),
            &format!("a writer is refused beside the readers after node {i} restarted"),
        );
    }
    let told = told.lock().unwrap().clone();
    assert!(told.is_empty(), "told lost: {told:?}");
    for guard in guards {
        let resource = guard.resource().to_owned();
        guard
            .unlock()
            .unwrap_or_else(|e| panic!("{resource}: lost at some moment: {e}"));
    }
}

#[test]
fn a_two_permit_guard_on_seven_nodes_is_kept_across_two_restarts_without_persistence_and_told_lost_within_an_extension_interval_after_a_third(
) {
    // q = floor(7 * 2 / 3) + 1 = 5: a member may be missing on 2 nodes.
    let nodes = cluster(7);
    let locks = builder(&nodes)
        .restart_grace(Duration::ZERO)
        .build()
        .expect("valid test configuration");
    every_node_answers(&locks);
    // An extension every fifth of the validity: about 1 s, while the
    // validity left never falls below 4 s. Told within an interval is
    // told by an extension, not by the validity running out.
    let ttl = Duration::from_secs(5);
    let interval = ttl / 5;
    let options = permits(2, ttl).extend_when_left(0.8);
    let guard = locks.lock("pool", options).expect("a permit");
    let told: Told = Arc::default();
    listen(&guard, &told);
    // Node 6 is never restarted: its score moves with each extension.
    let witness = nodes.node(6);
    wait_until(LANDED, "every node holds the permit", || {
        nodes.nodes().iter().all(|n| score(n, &guard).is_some())
    });
    // Waits for the next extension: node 6's score moves.
    let extended = |what: &str| {
        let was = score(witness, &guard).expect("node 6 holds it");
        wait_until(Duration::from_secs(10), what, || {
            score(witness, &guard).is_some_and(|s| s > was)
        });
    };
    for i in 0..2 {
        // Restarted just after an extension, the node is up again well
        // before the next one: no round finds it down.
        extended("an extension before the restart");
        nodes
            .node(i)
            .restart()
            .expect("restart without persistence");
        assert_eq!(score(nodes.node(i), &guard), None, "node {i} forgot it");
        // Two extensions after the restart: the first may have been on its
        // way as the node died.
        extended(&format!("a first extension after node {i} restarted"));
        extended(&format!("a second extension after node {i} restarted"));
        assert!(guard.is_held(), "lost after {} restarts", i + 1);
        let told = told.lock().unwrap().clone();
        assert!(told.is_empty(), "told lost: {told:?}");
    }
    extended("an extension before the third restart");
    let restarted = Instant::now();
    nodes
        .node(2)
        .restart()
        .expect("restart without persistence");
    // 3 nodes lost the member, more than N - q = 2: the next extension
    // finds it gone and tells.
    wait_until(Duration::from_secs(10), "the guard is told", || {
        !told.lock().unwrap().is_empty()
    });
    let (_, at, error) = told.lock().unwrap()[0].clone();
    let took = at - restarted;
    assert!(
        took <= interval + Duration::from_millis(1500),
        "told {took:?} after the third restart, extending every {interval:?}: {error}"
    );
    assert!(!guard.is_held());
    match guard.unlock() {
        Err(LockError::Lost { .. }) => {}
        other => panic!("expected the lost error, got {other:?}"),
    }
}

/// Commands a client may send that no script of ours calls. Scripts call
/// commands too, and `INFO commandstats` counts those as well. (No `CLIENT`
/// or `SCRIPT`: Redis 7 counts them by subcommand, and Redis 6.2 counts the
/// harness's own `CLIENT SETINFO` under `client`.)
const NOT_IN_SCRIPTS: &[&str] = &[
    "ping",
    "echo",
    "hello",
    "select",
    "auth",
    "subscribe",
    "unsubscribe",
    "psubscribe",
    "multi",
    "exec",
];

/// What each node ran, by `INFO commandstats`: the scripts (`EVALSHA` or
/// `EVAL`), and the commands no script calls.
fn sent(nodes: &Cluster) -> Vec<(u64, u64)> {
    (0..nodes.len())
        .map(|i| {
            (
                calls(nodes, i, &["evalsha", "eval"]),
                calls(nodes, i, NOT_IN_SCRIPTS),
            )
        })
        .collect()
}

#[test]
fn one_attempt_sends_exactly_one_command_per_node_where_the_permits_are_all_taken_or_a_writer_holds(
) {
    let ttl = Duration::from_secs(10);
    let nodes = cluster(5);
    let locks = client(&nodes);
    let third = client(&nodes);
    // Each client's connections are open (their handshake loads the
    // scripts).
    every_node_answers(&locks);
    every_node_answers(&third);
    let one = locks.acquire("full", permits(2, ttl)).expect("permit 1");
    let two = locks.acquire("full", permits(2, ttl)).expect("permit 2");
    let writer = locks.acquire("taken", ttl).expect("a writer");
    // The nodes past each quorum apply the writes just after. (Holders
    // are scored by their expiry; nothing else in the set counts.)
    wait_until(LANDED, "every node holds the locks", || {
        nodes.nodes().iter().all(|n| {
            let live = n.query(&["ZCOUNT", "full", "(0", "+inf"]).ok();
            let live: i64 = live
                .and_then(|c| redis::from_redis_value(c).ok())
                .unwrap_or(0);
            live == 2 && n.get("taken").ok().flatten().is_some()
        })
    });
    let mut extra = Vec::new();
    for (resource, options) in [("full", permits(2, ttl)), ("taken", shared(ttl))] {
        let before = sent(&nodes);
        let result = third.try_acquire(resource, options);
        let after = sent(&nodes);
        let report = match result {
            Err(LockError::Contended { report, .. }) => report,
            other => panic!("{resource}: expected the contended error, got {other:?}"),
        };
        for (i, (was, now)) in before.iter().zip(&after).enumerate() {
            let ran = (now.0 - was.0, now.1 - was.1);
            if ran != (1, 0) {
                extra.push(format!("{resource}: node {i} ran {ran:?}; {report}"));
            }
        }
    }
    assert!(
        extra.is_empty(),
        "(scripts, other commands) where one script each was due: {extra:#?}"
    );
    for lock in [one, two, writer] {
        locks.release(lock).expect("release");
    }
}
