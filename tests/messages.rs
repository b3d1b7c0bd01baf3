//! The errors' messages say each fact once, short enough to read in a log
//! line. Every `LockError` a user can meet is rendered against real nodes:
//! a wrong password, each kind's conflict, a kind mismatch, a long owner
//! label, a release of an expired lock of each kind, too few nodes after
//! several attempts, a lost lock, a cancelled wait, and bad arguments. No
//! clause or run of three words appears twice, each node of the report is
//! named at most once, and for 1 and 3 nodes each message is under 200
//! characters, all its lines together.

mod common;

use std::time::{Duration, Instant};

use common::cluster;
use redlock_sync::{
    Cancel, Kind, LockError, LockOptions, NodeOutcome, Redlock, RetryPolicy, Token, MAX_TTL,
};
use redlock_sync_testing::{Cluster, Fault};

const TTL: Duration = Duration::from_secs(10);

/// Checks that `message` says each fact once: no clause (the text between
/// `: `, `; `, `, `, brackets and line ends) of two words or more twice,
/// and no run of three words twice.
fn each_fact_once(message: &str) {
    let mut cut = message.to_string();
    for separator in [": ", "; ", ", ", " (", ")", "\n"] {
        cut = cut.replace(separator, "\u{0}");
    }
    let clauses: Vec<&str> = (cut.split('\u{0}'))
        .map(str::trim)
        .filter(|c| c.contains(' '))
        .collect();
    for (i, clause) in clauses.iter().enumerate() {
        assert!(
            !clauses[..i].contains(clause),
            "`{clause}` said twice: {message}"
        );
    }
    let words: Vec<String> = message
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| ",;:().".contains(c))
                .to_lowercase()
        })
        .collect();
    let runs: Vec<&[String]> = words.windows(3).collect();
    for (i, run) in runs.iter().enumerate() {
        assert!(
            !runs[..i].contains(run),
            "`{}` said twice: {message}",
            run.join(" ")
        );
    }
}

/// Checks `error`'s message: each fact once, each node of its report named
/// at most once. Returns it.
fn checked(error: &LockError) -> String {
    let message = error.to_string();
    eprintln!("{} characters: {message}", message.chars().count());
    each_fact_once(&message);
    for node in error.report().map_or(&[][..], |r| &r.nodes) {
        let named = message.matches(&*node.node).count();
        assert!(named <= 1, "{} named {named} times: {message}", node.node);
    }
    message
}

/// [`checked`], and under 200 characters. Returns the message.
fn short(error: &LockError) -> String {
    let message = checked(error);
    let length = message.chars().count();
    assert!(length < 200, "{length} characters: {message}");
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

/// Waits until no node of `nodes` has the key `resource`.
fn wait_until_gone(nodes: &Cluster, resource: &str) {
    let start = Instant::now();
    let exists = |i: usize| {
        let reply = nodes.node(i).query(&["EXISTS", resource]).unwrap();
        reply != redis::Value::Int(0)
    };
    while (0..nodes.len()).any(exists) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "`{resource}` stays"
        );
        std::thread::sleep(Duration::from_millis(10));
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

    let mut lock = locks.try_acquire("lost", TTL).unwrap();
    common::wait_until_held_by(&nodes, &lock, 5);
    for node in nodes.nodes() {
        node.set("lost", "someone-else").unwrap();
    }
    let taken = locks.extend(&mut lock, TTL).unwrap_err();
    assert!(matches!(taken, LockError::Lost { .. }), "{taken:?}");
    let message = short(&taken);
    assert!(message.contains("another token"), "{message}");
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
fn too_few_nodes_after_several_attempts_says_the_count_once() {
    let nodes = cluster(3);
    for i in 0..2 {
        nodes.node(i).kill().unwrap();
    }
    let locks = common::builder(&nodes)
        .retry_policy(common::quick_retries(3))
        .build()
        .unwrap();
    let no_quorum = attempt_until("quorum error", || match locks.acquire("r", TTL) {
        Err(e @ LockError::NoQuorum { attempts: 4, .. }) => Some(e),
        _ => None,
    });
    let message = short(&no_quorum);
    assert_eq!(message.matches("attempt").count(), 1, "{message}");
    assert_eq!(message.matches("too few").count(), 1, "{message}");
}

#[test]
fn a_wrong_password_on_1_3_or_5_nodes_names_each_node_once_and_gives_its_hint_once() {
    // Of how many nodes, how many have the wrong password.
    for (n, wrong) in [(1, 1), (3, 3), (5, 3), (5, 5)] {
        let nodes = cluster(n);
        for node in nodes.nodes() {
            node.query(&["CONFIG", "SET", "requirepass", "right-Pw"])
                .unwrap();
        }
        let urls = nodes.urls().into_iter().enumerate();
        let locks = once(
            urls.map(|(i, u)| {
                let password = if i < wrong { "wrong-Pw" } else { "right-Pw" };
                u.replace("redis://", &format!("redis://:{password}@"))
            })
            .collect(),
        );
        let unusable = locks.try_acquire("r", TTL).unwrap_err();
        assert!(
            matches!(unusable, LockError::Unusable { .. }),
            "{unusable:?}"
        );
        let message = if wrong < 5 {
            short(&unusable)
        } else {
            checked(&unusable)
        };
        let report = unusable.report().unwrap();
        for node in &report.nodes[..wrong] {
            assert!(
                message.contains(&*node.node),
                "{} not named: {message}",
                node.node
            );
            // A node's own error does not name it again: the report does.
            let NodeOutcome::Failed(error) = &node.outcome else {
                panic!("{}: {}", node.node, node.outcome);
            };
            assert!(!error.to_string().contains(&*node.node), "{error}");
        }
        for node in &report.nodes[wrong..] {
            assert!(!message.contains(&*node.node), "{message}");
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
    }
}

/// Each kind's holder, and the kind of a call it refuses: a plain lock
/// refuses a plain one, a fenced one a fenced one, a writer a reader, and a
/// semaphore of one permit another holder.
const CONFLICTS: [(Kind, Kind); 4] = [
    (Kind::Plain, Kind::Plain),
    (Kind::Fenced, Kind::Fenced),
    (Kind::Plain, Kind::Shared),
    (Kind::Semaphore(1), Kind::Semaphore(1)),
];

#[test]
fn each_kinds_conflict_on_1_or_3_nodes_says_held_by_another_client_once_in_under_200_characters() {
    for n in [1, 3] {
        let nodes = cluster(n);
        let locks = once(nodes.urls());
        for (i, (held, asked)) in CONFLICTS.into_iter().enumerate() {
            let resource = format!("conflict-{i}");
            let holder = locks
                .try_acquire(&resource, LockOptions::new(TTL).kind(held))
                .unwrap();
            let contended = attempt_until("contention", || {
                match locks.try_acquire(&resource, LockOptions::new(TTL).kind(asked)) {
                    Err(e @ LockError::Contended { .. }) => Some(e),
                    _ => None,
                }
            });
            let message = short(&contended);
            assert!(message.contains("held by another client"), "{message}");
            assert!(message.contains("0 granted"), "{message}");
            locks.release(holder).unwrap();
        }
    }
}

#[test]
fn a_reader_where_a_semaphore_holds_is_told_the_holders_kind_not_that_nodes_cannot_serve() {
    for n in [1, 3] {
        let nodes = cluster(n);
        let locks = once(nodes.urls());
        let permits = LockOptions::new(TTL).kind(Kind::Semaphore(2));
        let _holder = locks.try_acquire("mixed", permits).unwrap();
        let reader = LockOptions::new(TTL).kind(Kind::Shared);
        let mismatch = locks.try_acquire("mixed", reader).unwrap_err();
        assert!(
            matches!(mismatch, LockError::Unusable { .. }),
            "{mismatch:?}"
        );
        let message = short(&mismatch);
        assert!(message.contains("a semaphore of 2 permits"), "{message}");
        assert!(!message.contains("can serve"), "{message}");
        assert_eq!(message.matches("kind").count(), 1, "{message}");
    }
}

#[test]
fn a_300_byte_owner_label_is_cut_in_the_message_and_a_200_byte_one_is_stored_whole() {
    let nodes = cluster(1);
    let locks = once(nodes.urls());
    let long = "o".repeat(300);
    let options = LockOptions::new(TTL).owner(&long);
    let refused = locks.try_acquire("labelled", options).unwrap_err();
    let message = short(&refused);
    assert!(message.contains("300 bytes"), "{message}");
    assert!(message.contains('…'), "{message}");
    assert!(!message.contains(&"o".repeat(40)), "{message}");

    let longest = "p".repeat(200);
    let options = LockOptions::new(TTL).owner(&longest);
    let lock = locks.try_acquire("labelled", options).unwrap();
    let stored = nodes.node(0).get("labelled").unwrap().unwrap();
    assert!(stored.ends_with(&longest), "{stored}");
    locks.release(lock).unwrap();
}

#[test]
fn extending_or_releasing_an_expired_lock_of_each_kind_says_renewed_or_deleted_once() {
    let kinds = [Kind::Plain, Kind::Fenced, Kind::Shared, Kind::Semaphore(1)];
    for n in [1, 3] {
        let nodes = cluster(n);
        let locks = once(nodes.urls());
        for kind in kinds {
            let resource = format!("expired-{kind:?}");
            let options = LockOptions::new(Duration::from_millis(100)).kind(kind);
            let mut lock = locks.try_acquire(&resource, options).unwrap();
            wait_until_gone(&nodes, &resource);
            let lost = locks.extend(&mut lock, TTL).unwrap_err();
            assert!(matches!(lost, LockError::Lost { .. }), "{kind:?}: {lost:?}");
            let message = short(&lost);
            assert!(message.contains("0 renewed"), "{kind:?}: {message}");
            assert!(!message.contains("granted"), "{kind:?}: {message}");
            let lost = locks.release(lock).unwrap_err();
            assert!(matches!(lost, LockError::Lost { .. }), "{kind:?}: {lost:?}");
            let message = short(&lost);
            assert!(message.contains("0 deleted"), "{kind:?}: {message}");
            assert!(!message.contains("granted"), "{kind:?}: {message}");
        }
    }
}

#[test]
fn a_report_of_five_nodes_calls_the_nodes_not_awaited_so_not_granted() {
    let nodes = cluster(5);
    let locks = once(nodes.urls());
    let start = Instant::now();
    let report = loop {
        let lock = locks.try_acquire("quick", TTL).unwrap();
        let report = lock.report().clone();
        locks.release(lock).unwrap();
        let mut outcomes = report.nodes.iter().map(|n| &n.outcome);
        if outcomes.any(|o| *o == NodeOutcome::NotAwaited) {
            break report;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no early round");
    };
    let text = report.to_string();
    let not_awaited = report.nodes.len() - report.granted();
    let counts = format!("{} granted, {not_awaited} not awaited", report.granted());
    assert!(text.starts_with(&counts), "{text}");
    assert!(!text.contains("/5"), "{text}");
}

#[test]
fn a_cancelled_wait_says_so_once() {
    let nodes = cluster(1);
    let locks = once(nodes.urls());
    let cancel = Cancel::new();
    cancel.cancel();
    let options = LockOptions::new(TTL).cancel(&cancel);
    let cancelled = locks.acquire("r", options).unwrap_err();
    assert!(
        matches!(cancelled, LockError::Cancelled { .. }),
        "{cancelled:?}"
    );
    let message = short(&cancelled);
    assert!(message.contains("cancelled"), "{message}");
}

#[test]
fn each_argument_and_configuration_error_says_each_fact_once_in_under_200_characters() {
    let nodes = cluster(1);
    let locks = once(nodes.urls());
    let ttl = LockOptions::new(TTL);
    let errors = [
        locks.try_acquire("", TTL).unwrap_err(),
        locks.try_acquire(Vec::<String>::new(), TTL).unwrap_err(),
        locks.try_acquire(["a", "a"], TTL).unwrap_err(),
        locks.try_acquire("a", Duration::ZERO).unwrap_err(),
        locks
            .try_acquire("a", Duration::from_millis(2))
            .unwrap_err(),
        locks.try_acquire("a", MAX_TTL * 2).unwrap_err(),
        LockError::from("XYZ".parse::<Token>().unwrap_err()),
        (locks.try_acquire(["a", "b"], ttl.clone().kind(Kind::Fenced))).unwrap_err(),
        (locks.try_acquire("a", ttl.clone().kind(Kind::Semaphore(0)))).unwrap_err(),
        (locks.try_acquire("a", ttl.clone().owner(""))).unwrap_err(),
        (locks.try_acquire("a", ttl.clone().owner("tab\there"))).unwrap_err(),
        (locks.lock("a", ttl.clone().extend_when_left(1.5))).unwrap_err(),
        locks.try_acquire("redlock-sync:a", TTL).unwrap_err(),
        Redlock::new(Vec::<String>::new()).unwrap_err(),
        Redlock::new(["redis://:secret@127.0.0.1:99999"]).unwrap_err(),
        Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7001/1"]).unwrap_err(),
        (Redlock::builder(["redis://127.0.0.1:7001"]).drift_factor(1.5))
            .build()
            .unwrap_err(),
        (Redlock::builder(["redis://127.0.0.1:7001"]).extend_when_left(0.0))
            .build()
            .unwrap_err(),
        (Redlock::builder(["redis://127.0.0.1:7001"]).io_timeout(Duration::ZERO))
            .build()
            .unwrap_err(),
        (Redlock::builder(["redis://127.0.0.1:7001"]).connect_timeout(Duration::MAX))
            .build()
            .unwrap_err(),
    ];
    for error in &errors {
        assert!(
            matches!(error, LockError::Argument(_) | LockError::Config(_)),
            "{error:?}"
        );
        let message = short(error);
        assert!(!message.contains("secret"), "{message}");
    }
}
