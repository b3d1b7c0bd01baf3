//! The errors' messages say each fact once, short enough to read in a log
//! line: for five nodes named `127.0.0.1:PORT`, the message of each error
//! that talks to nodes (held by another client, too few nodes, a wrong
//! password on every node, a lost lock, a round slower than the TTL) is
//! under 200 characters, names each node at most once, and gives a hint
//! once, not once per node.

mod common;

use std::time::{Duration, Instant};

use common::cluster;
use redlock_sync::{LockError, NodeOutcome, Redlock, RetryPolicy};
use redlock_sync_testing::Fault;

const TTL: Duration = Duration::from_secs(10);

/// Checks `error`'s message: under 200 characters, each node of its
/// report named at most once; returns it.
fn short(error: &LockError) -> String {
    let message = error.to_string();
    eprintln!("{} characters: {message}", message.len());
    assert!(
        message.len() < 200,
        "{} characters: {message}",
        message.len()
    );
    for node in error.report().map_or(&[][..], |r| &r.nodes) {
        let named = message.matches(&*node.node).count();
        assert!(named <= 1, "{} named {named} times: {message}", node.node);
    }
    message
}

/// A client over `urls` that tries once, with roomy timeouts.
fn once(urls: Vec<String>) -> Redlock {
    Redlock::builder(urls)
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Takes one attempt after another until one ends in the error `what` (a busy
/// machine may time a healthy node out now and then); returns it.
fn attempt_until(what: &str, mut attempt: impl FnMut() -> Option<LockError>) -> LockError {
    let start = Instant::now();
    loop {
        if let Some(error) = attempt() {
            return error;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no {what}");
    }
}

#[test]
fn contended_lost_and_too_slow_say_each_fact_once_in_under_200_characters() {
    let nodes = cluster(5);
    let proxies = nodes.proxies().unwrap();
    let locks = once(proxies.iter().map(|p| p.url()).collect());
    let holder = once(nodes.urls());

    let held = holder.acquire("r", TTL).unwrap();
    let contended = attempt_until("contention", || match locks.try_acquire("r", TTL) {
        Err(e @ LockError::Contended { .. }) => Some(e),
        _ => None,
    });
    let message = short(&contended);
    assert!(message.contains("held by another client"), "{message}");
    holder.release(held).unwrap();

    let lock = locks.try_acquire("lost", TTL).unwrap();
    common::wait_until_held_by(&nodes, &lock, 5);
    for node in nodes.nodes() {
        node.set("lost", "someone-else").unwrap();
    }
    let lost = locks.release(lock).unwrap_err();
    assert!(matches!(lost, LockError::Lost { .. }), "{lost:?}");
    let message = short(&lost);
    assert!(message.contains("was lost"), "{message}");

    // A round trip of 300 ms through the proxies, against a TTL of 200 ms.
    for proxy in &proxies {
        proxy.set_fault(Fault::Delay(Duration::from_millis(150)));
    }
    let too_slow = attempt_until("round too slow", || {
        match locks.try_acquire("slow", Duration::from_millis(200)) {
            Err(e @ LockError::TooSlow { .. }) => Some(e),
            _ => None,
        }
    });
    let message = short(&too_slow);
    assert!(message.contains("whole TTL"), "{message}");
}

#[test]
fn too_few_nodes_names_each_failed_node_once_with_its_failure_in_under_200_characters() {
    let nodes = cluster(5);
    for i in 0..3 {
        nodes.node(i).kill().unwrap();
    }
    let locks = once(nodes.urls());
    let no_quorum = attempt_until("quorum error", || match locks.try_acquire("r", TTL) {
        Err(e @ LockError::NoQuorum { .. }) => Some(e),
        _ => None,
    });
    let message = short(&no_quorum);
    for node in &no_quorum.report().unwrap().nodes[..3] {
        assert!(
            message.contains(&*node.node),
            "{} not named: {message}",
            node.node
        );
    }
    // One failure, said once for the three nodes.
    let failure = match &no_quorum.report().unwrap().nodes[0].outcome {
        NodeOutcome::Failed(e) => e.to_string(),
        other => other.to_string(),
    };
    assert_eq!(message.matches(&failure).count(), 1, "{message}");
}

#[test]
fn a_wrong_password_on_every_node_gives_its_hint_once_in_under_200_characters() {
    let nodes = cluster(5);
    for node in nodes.nodes() {
        node.query(&["CONFIG", "SET", "requirepass", "right-Pw"])
            .unwrap();
    }
    let wrong = nodes.urls().into_iter();
    let locks = once(
        wrong
            .map(|u| u.replace("redis://", "redis://:wrong-Pw@"))
            .collect(),
    );
    let unusable = locks.try_acquire("r", TTL).unwrap_err();
    assert!(
        matches!(unusable, LockError::Unusable { .. }),
        "{unusable:?}"
    );
    let message = short(&unusable);
    let report = unusable.report().unwrap();
    for node in &report.nodes {
        assert!(
            message.contains(&*node.node),
            "{} not named: {message}",
            node.node
        );
    }
    assert_eq!(
        message.matches("refused authentication").count(),
        1,
        "{message}"
    );
    assert_eq!(
        message.matches("redis://:password@").count(),
        1,
        "{message}"
    );
    assert!(!message.contains("wrong-Pw") && !message.contains("right-Pw"));
    // A node's own error does not name it again: the report does.
    for node in &report.nodes {
        let NodeOutcome::Failed(error) = &node.outcome else {
            panic!("{}: {}", node.node, node.outcome);
        };
        assert!(!error.to_string().contains(&*node.node), "{error}");
    }
}
