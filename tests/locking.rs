//! The basic lock operations against real redis-server nodes: what the nodes
//! hold after acquire, release, extend; contention; expiry; tokens carried
//! between clients.

mod common;

use std::sync::Barrier;
use std::time::Duration;

use common::{
    client, cluster, holders, values, wait_until, wait_until_gone, wait_until_held_by, SETTLE,
};
use redlock_sync::{Kind, Lock, LockError, NodeError, NodeOutcome, Redlock, RetryPolicy, Token};
use redlock_sync_testing::{Fault, Proxy};

const TTL: Duration = Duration::from_secs(10);

#[test]
fn acquire_sets_our_token_with_the_ttl_on_every_node_and_release_removes_it() {
    let nodes = cluster(5);
    let locks = client(&nodes);

    let lock = locks
        .acquire("invoice:42", TTL)
        .expect("free lock is granted");
    let token = lock.token().to_string();
    assert_eq!(lock.resource(), "invoice:42");
    assert!(
        lock.validity() > TTL - Duration::from_millis(500) && lock.validity() <= TTL,
        "validity {:?} should be just under the TTL {TTL:?}",
        lock.validity()
    );
    assert!(lock.report().granted() >= 3, "report: {}", lock.report());
    for (i, node) in nodes.nodes().iter().enumerate() {
        assert_eq!(
            node.get("invoice:42").unwrap().as_deref(),
            Some(token.as_str()),
            "node {i} should hold our token"
        );
        let pttl = node.pttl("invoice:42").unwrap();
        assert!(
            (9_000..=10_000).contains(&pttl),
            "node {i}: PTTL {pttl} ms should be close to 10000 ms"
        );
    }

    let report = locks
        .release(lock)
        .expect("release of a held lock succeeds");
    assert!(report.granted() >= 3, "report: {report}");
    // The release went to every node; the replies past the quorum are read
    // later, so the last deletions may land just after release returns.
    wait_until_gone(&nodes, "invoice:42", SETTLE);
}

#[test]
fn of_two_clients_exactly_one_wins_and_the_other_can_acquire_after_release() {
    let nodes = cluster(5);
    let first = client(&nodes);
    let second = client(&nodes);
    let barrier = Barrier::new(2);

    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            barrier.wait();
            first.try_acquire("report", TTL)
        });
        let b = s.spawn(|| {
            barrier.wait();
            second.try_acquire("report", TTL)
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let (winner_client, winner, loser_client, loser) = match (a, b) {
        (Ok(lock), Err(e)) => (&first, lock, &second, e),
        (Err(e), Ok(lock)) => (&second, lock, &first, e),
        (a, b) => panic!("exactly one should win, got {a:?} and {b:?}"),
    };
    assert!(
        matches!(
            loser,
            LockError::Contended { .. } | LockError::NoQuorum { .. }
        ),
        "the loser of a race is refused: {loser}"
    );

    // The race may have split the vote (the winner got a quorum, the loser
    // the rest, which it released), so the winner holds a quorum of nodes.
    assert!(holders(&nodes, &winner) >= 3, "the winner holds a quorum");
    // With the winner holding it, the loser's retries all fail as contended.
    match loser_client.acquire("report", TTL) {
        Err(LockError::Contended {
            attempts, report, ..
        }) => {
            assert_eq!(attempts, 4, "retry_count 3 means 4 attempts");
            assert!(report.refused() >= 3, "a quorum refuses: {report}");
        }
        other => panic!("expected the contended error, got {other:?}"),
    }
    let token = winner.token().to_string();
    wait_until(SETTLE, "the loser's clean-up removed its own keys", || {
        values(&nodes, "report")
            .iter()
            .all(|v| v.is_none() || v.as_deref() == Some(token.as_str()))
    });
    assert!(
        holders(&nodes, &winner) >= 3,
        "the winner still holds a quorum"
    );

    winner_client.release(winner).expect("winner releases");
    let lock = loser_client
        .acquire("report", TTL)
        .expect("after release the other client acquires");
    loser_client.release(lock).unwrap();
}

#[test]
fn release_after_expiry_and_takeover_reports_lost_and_leaves_the_new_holders_key() {
    let nodes = cluster(5);
    let first = client(&nodes);
    let second = client(&nodes);

    let stale = first
        .acquire("job", Duration::from_millis(200))
        .expect("granted");
    wait_until_gone(&nodes, "job", Duration::from_secs(5));
    assert!(!stale.is_valid(), "validity ran out with the keys");
    let current = second.acquire("job", TTL).expect("expired lock is free");

    match first.release(stale) {
        Err(LockError::Lost {
            resource, report, ..
        }) => {
            assert_eq!(resource, "job");
            assert!(report.refused() >= 3, "no node held our token: {report}");
        }
        other => panic!("expected the lost-lock error, got {other:?}"),
    }
    assert_eq!(
        holders(&nodes, &current),
        5,
        "the new holder's key is untouched on every node"
    );
    second.release(current).unwrap();
}

#[test]
fn extend_keeps_the_lock_past_its_ttl_and_fails_once_it_expired() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let rival = client(&nodes);
    // Four times the clients' I/O timeout: on a busy machine a round that
    // waits out a slow node still ends well within the TTL.
    let ttl = Duration::from_secs(2);

    let mut lock = locks.acquire("lease", ttl).expect("granted");
    let original_deadline = lock.valid_until();
    // Extend every fifth of the TTL for about three TTLs; the rival never
    // gets in.
    for _ in 0..15 {
        std::thread::sleep(ttl / 5);
        locks.extend(&mut lock, ttl).expect("extension while held");
        assert!(
            lock.validity() > ttl / 2,
            "an extension restores most of the TTL: {:?} left",
            lock.validity()
        );
        assert!(
            matches!(
                rival.try_acquire("lease", ttl),
                Err(LockError::Contended { .. })
            ),
            "the rival must not win while the lock is extended"
        );
    }
    assert!(
        lock.valid_until() > original_deadline + ttl,
        "the lock outlived its original TTL"
    );
    assert_eq!(holders(&nodes, &lock), 5);

    wait_until_gone(&nodes, "lease", Duration::from_secs(5));
    match locks.extend(&mut lock, ttl) {
        Err(LockError::Lost { report, .. }) => assert!(report.refused() >= 3, "{report}"),
        other => panic!("expected the lost-lock error, got {other:?}"),
    }
    assert_eq!(
        values(&nodes, "lease"),
        vec![None; 5],
        "extend created no key"
    );
}

#[test]
fn a_resource_and_token_carried_to_another_client_release_and_extend_the_lock_there() {
    let nodes = cluster(3);
    let acquiring = client(&nodes);
    let lock = acquiring.acquire("nightly", TTL).expect("granted");
    // What a CLI would print and read back in another process.
    let (resource, token_text) = (lock.resource().to_string(), lock.token().to_string());
    drop(lock);

    let other = client(&nodes);
    let token: Token = token_text.parse().expect("a printed token parses");
    let mut carried = Lock::from_token(resource.clone(), token, Kind::Plain).unwrap();
    assert!(carried.validity().is_zero(), "unknown validity is zero");

    other
        .extend(&mut carried, TTL)
        .expect("extend with a carried token");
    assert!(carried.validity() > TTL - Duration::from_secs(1));
    wait_until_held_by(&nodes, &carried, 3);

    other
        .release(carried)
        .expect("release with a carried token");
    wait_until_gone(&nodes, &resource, SETTLE);

    // A made-up token releases nothing that someone else holds.
    let held = acquiring.acquire("nightly", TTL).unwrap();
    let forged = Lock::from_token("nightly", Token::random().unwrap(), Kind::Plain).unwrap();
    assert!(matches!(other.release(forged), Err(LockError::Lost { .. })));
    assert_eq!(holders(&nodes, &held), 3, "the holder's keys are untouched");
    acquiring.release(held).unwrap();
}

#[test]
fn after_script_flush_release_falls_back_to_eval_and_later_rounds_heal() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    // Warm the connections: their servers have our scripts.
    let lock = locks.acquire("flush", TTL).unwrap();
    locks.release(lock).unwrap();
    for node in nodes.nodes() {
        node.query(&["SCRIPT", "FLUSH"]).unwrap();
    }
    let short = Duration::from_millis(800);
    let lock = locks.acquire("flush", short).unwrap();
    let report = locks.release(lock).expect("release survives SCRIPT FLUSH");
    assert!(
        report
            .nodes
            .iter()
            .all(|n| matches!(n.outcome, NodeOutcome::Granted | NodeOutcome::NotAwaited)),
        "no awaited node failed: the EVALSHA that met NOSCRIPT went again as EVAL: {report}"
    );
    assert!(report.granted() >= 2, "{report}");
    // A release left unread met NOSCRIPT and is not replayed (a replay could
    // land behind a later command and undo it): there the key keeps its TTL.
    wait_until_gone(&nodes, "flush", SETTLE + short);

    // Every connection learns that its server lost the scripts when it
    // reads that NOSCRIPT, at the latest when its backlog of unread replies
    // (32: a node always read last is still read every 32 rounds) is
    // drained; from then on releases work on every node.
    for i in 0..20 {
        let lock = locks.acquire(format!("flush-{i}"), TTL).unwrap();
        locks.release(lock).unwrap();
    }
    let lock = locks.acquire("flush-last", TTL).unwrap();
    locks.release(lock).unwrap();
    wait_until_gone(&nodes, "flush-last", SETTLE);
}

/// A regression test from review: a clean-up release that met NOSCRIPT used
/// to be replayed as EVAL behind the next attempt's SET with the same token,
/// deleting a grant the client had counted; a second client then won too.
#[test]
fn a_clean_up_after_script_flush_never_undoes_a_later_grant() {
    let nodes = cluster(3);
    let (x, y, z) = (nodes.node(0), nodes.node(1), nodes.node(2));
    let locks = common::builder(&nodes)
        .retry_policy(
            RetryPolicy::default()
                .retries(5)
                .delay(Duration::from_millis(1100))
                .jitter(Duration::ZERO),
        )
        .build()
        .unwrap();
    for i in 0..9 {
        let lock = locks.acquire(format!("warm{i}"), TTL).unwrap();
        locks.release(lock).unwrap();
    }
    // Another client holds the resource on y (briefly) and z (longer), and
    // x loses its scripts: attempt 1 wins x only and cleans up there.
    y.query(&["SET", "res", "other", "PX", "600"]).unwrap();
    z.query(&["SET", "res", "other", "PX", "1500"]).unwrap();
    x.query(&["SCRIPT", "FLUSH"]).unwrap();

    let lock = locks
        .acquire("res", Duration::from_secs(1))
        .expect("x and y grant a later attempt");
    let token = lock.token().to_string();
    wait_until(SETTLE, "z's foreign key expired", || {
        z.get("res").unwrap().is_none()
    });
    assert!(lock.is_valid(), "{:?} left", lock.validity());
    for entry in lock.report().nodes.iter() {
        if entry.outcome == NodeOutcome::Granted {
            let node = nodes
                .nodes()
                .iter()
                .find(|n| n.url().ends_with(&*entry.node));
            let held = node.unwrap().get("res").unwrap();
            assert_eq!(
                held.as_deref(),
                Some(token.as_str()),
                "{} was counted as granted and must still hold our key",
                entry.node
            );
        }
    }
    let rival = Redlock::new(nodes.urls()).unwrap();
    match rival.try_acquire("res", TTL) {
        Err(LockError::Contended { .. }) => {}
        other => panic!("two holders at once: {other:?}"),
    }
}

#[test]
fn the_same_server_under_two_names_gets_one_vote() {
    let nodes = cluster(2);
    let port = nodes.node(0).port().expect("a TCP node");
    // Three URLs, quorum 2; two of them name node 0 (no URL check can tell).
    let urls = [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        nodes.node(1).url(),
    ];
    let locks = Redlock::builder(&urls)
        .retry_policy(
            RetryPolicy::default()
                .retries(2)
                .delay(Duration::from_millis(10)),
        )
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .expect("three URLs that differ as text");
    let mut lock = locks.acquire("one-vote", TTL).expect("two servers answer");

    // With node 1 gone, node 0 alone holds our key. Under two names it would
    // extend it twice and make a quorum of two by itself; as one server it
    // is one vote, and the extension fails.
    nodes.node(1).kill().unwrap();
    match locks.extend(&mut lock, TTL) {
        Err(LockError::NoQuorum { report, .. }) => {
            assert!(report.granted() <= 1, "{report}");
            assert!(
                report.nodes.iter().any(|n| matches!(
                    &n.outcome,
                    NodeOutcome::Failed(NodeError::SameServer { .. })
                )),
                "the report names the duplicate: {report}"
            );
        }
        other => panic!("one server must not confirm an extension as a quorum: {other:?}"),
    }
}

#[test]
fn nodes_named_by_host_name_are_resolved_and_locked() {
    let nodes = cluster(3);
    let urls: Vec<String> = nodes
        .nodes()
        .iter()
        .map(|n| format!("redis://localhost:{}", n.port().expect("a TCP node")))
        .collect();
    let locks = roomy(&urls);
    let lock = locks.acquire("by-name", TTL).expect("localhost resolves");
    wait_until_held_by(&nodes, &lock, 3);
    locks.release(lock).unwrap();
    wait_until_gone(&nodes, "by-name", SETTLE);
}

#[test]
fn a_node_whose_name_does_not_resolve_fails_within_the_connect_timeout() {
    let nodes = cluster(2);
    let mut urls = nodes.urls();
    // `.invalid` never resolves (RFC 2606). Whether the resolver says so at
    // once or never answers, the round goes on without that node.
    urls.push("redis://no-such-host.invalid:6379".to_string());
    let connect_timeout = Duration::from_millis(200);
    let locks = Redlock::builder(&urls)
        .connect_timeout(connect_timeout)
        .io_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let lock = locks
        .acquire("unresolved", TTL)
        .expect("two of three nodes");
    let entry = &lock.report().nodes[2];
    match &entry.outcome {
        NodeOutcome::TimedOut => {}
        NodeOutcome::Failed(NodeError::Connect(message)) => {
            assert!(message.contains("no-such-host.invalid"), "{message}");
        }
        other => panic!("expected a connect failure or timeout, got {other:?}"),
    }
    assert!(
        entry.elapsed < connect_timeout + Duration::from_millis(300),
        "the unresolvable node held the round {:?}, past its connect timeout {connect_timeout:?}",
        entry.elapsed
    );
    locks.release(lock).unwrap();
}

#[test]
fn unix_socket_nodes_work_like_tcp_nodes() {
    let nodes = redlock_sync_testing::Cluster::start_unix(3)
        .unwrap_or_else(|e| panic!("could not start unix-socket nodes: {e}"));
    let locks = roomy(&nodes.urls());
    let lock = locks.acquire("over-unix", TTL).unwrap();
    wait_until_held_by(&nodes, &lock, 3);
    locks.release(lock).unwrap();
    wait_until_gone(&nodes, "over-unix", SETTLE);
}

/// GET over a fresh connection to `url` (which may carry a password and db).
fn get_at(url: &str, key: &str) -> Option<String> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_connection().unwrap();
    redis::cmd("GET").arg(key).query(&mut con).unwrap()
}

#[test]
fn password_and_db_in_the_url_are_used() {
    let nodes = cluster(3);
    for node in nodes.nodes() {
        node.query(&["CONFIG", "SET", "requirepass", "s3cret"])
            .unwrap();
    }
    let with_password: Vec<String> = nodes
        .urls()
        .iter()
        .map(|u| u.replace("redis://", "redis://:s3cret@"))
        .collect();
    let in_db2: Vec<String> = with_password.iter().map(|u| format!("{u}/2")).collect();

    let locks = Redlock::new(&in_db2).unwrap();
    let lock = locks.acquire("in-db-2", TTL).expect("AUTH and SELECT work");
    let token = lock.token().to_string();
    for (db2, db0) in in_db2.iter().zip(&with_password) {
        assert_eq!(get_at(db2, "in-db-2").as_deref(), Some(token.as_str()));
        assert_eq!(get_at(db0, "in-db-2"), None, "db 0 is not touched");
    }

    let without_password = Redlock::new(nodes.urls()).unwrap();
    match without_password.try_acquire("x", TTL) {
        Err(LockError::Unusable { report, .. }) => {
            assert!(report.failed() >= 2, "{report}");
            assert!(!report.to_string().contains("s3cret"));
        }
        other => panic!("without the password every node fails: {other:?}"),
    }
    locks.release(lock).unwrap();
    wait_until(SETTLE, "the key is gone from db 2 everywhere", || {
        in_db2.iter().all(|db2| get_at(db2, "in-db-2").is_none())
    });
}

/// A client over `urls` with timeouts a busy machine does not overrun.
fn roomy(urls: &[String]) -> Redlock {
    Redlock::builder(urls)
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// Three nodes behind proxies, and a client over them with room for slow
/// replies.
fn proxied_client(nodes: &redlock_sync_testing::Cluster) -> (Vec<Proxy>, Redlock) {
    let proxies = nodes.proxies().unwrap();
    let locks = Redlock::builder(proxies.iter().map(Proxy::url))
        .io_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    (proxies, locks)
}

/// Makes the nodes `slow` answer every byte `late`, the others at once,
/// and runs three rounds that read every node: rounds read the nodes that
/// kept them waiting last (by the power of two of a moving average of
/// their wait), so from then on they read the slow ones after the others,
/// and leave their replies unread once the others decided.
fn read_last(proxies: &[Proxy], locks: &Redlock, slow: &[usize], late: Duration) {
    for (i, proxy) in proxies.iter().enumerate() {
        let delay = if slow.contains(&i) {
            late
        } else {
            Duration::ZERO
        };
        proxy.set_fault(Fault::Delay(delay));
    }
    for _ in 0..3 {
        locks.inspect("warm-up").unwrap();
    }
}

/// Acquires and releases `resource`, and waits until node 0 no longer
/// holds it: the release must have run there, though its reply, if it
/// met `NOSCRIPT`, was read and retried as `EVAL` only if node 0 was read
/// first.
fn released_on_node_0(nodes: &redlock_sync_testing::Cluster, locks: &Redlock, resource: &str) {
    let lock = locks.acquire(resource, Duration::from_secs(60)).unwrap();
    let token = lock.token().to_string();
    wait_until(SETTLE, "node 0 holds the lock's key", || {
        nodes.node(0).get(resource).unwrap().as_deref() == Some(&*token)
    });
    locks.release(lock).unwrap();
    wait_until(SETTLE, "node 0 ran the release it was sent", || {
        nodes.node(0).get(resource).unwrap().is_none()
    });
}

/// After `SCRIPT FLUSH`, releases left unread run again on that node once
/// the connection saw a `NOSCRIPT`: one left unread and discarded later
/// makes it send its scripts as `EVAL` from then on; one it read is
/// retried as `EVAL`, which caches the script on the server again.
/// Otherwise a release left unread there would meet `NOSCRIPT` too, and
/// its key stay until its TTL.
#[test]
fn once_a_connection_saw_noscript_read_or_unread_releases_left_unread_still_run() {
    let nodes = cluster(3);
    // Learned from a NOSCRIPT left unread: node 0 is read last.
    let (proxies, locks) = proxied_client(&nodes);
    read_last(&proxies, &locks, &[0], Duration::from_millis(150));
    nodes.node(0).query(&["SCRIPT", "FLUSH"]).unwrap();
    let unread = locks.acquire("unread", Duration::from_secs(60)).unwrap();
    locks.release(unread).unwrap();
    // A round that reads every node reads and discards that NOSCRIPT.
    locks.inspect("unread").unwrap();
    released_on_node_0(&nodes, &locks, "after-unread");
    drop((proxies, locks));

    // Learned from a NOSCRIPT read: node 0 is read first, then last (its
    // delay then far longer than the others' was, for their averages to
    // part).
    let (proxies, locks) = proxied_client(&nodes);
    read_last(&proxies, &locks, &[1, 2], Duration::from_millis(50));
    nodes.node(0).query(&["SCRIPT", "FLUSH"]).unwrap();
    released_on_node_0(&nodes, &locks, "read");
    read_last(&proxies, &locks, &[0], Duration::from_millis(400));
    released_on_node_0(&nodes, &locks, "after-read");
}
