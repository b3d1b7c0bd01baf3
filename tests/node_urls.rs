//! Node URLs against real redis-server nodes: the `valkey` schemes, and
//! nodes that require a password (set with `CONFIG SET requirepass`, or an
//! ACL user), reached with the right, a wrong, or a misplaced password.

mod common;

use std::time::Duration;

use common::{cluster, values, wait_until, SETTLE};
use redlock_sync::{LockError, NodeError, NodeOutcome, Redlock, Report, RetryPolicy};
use redlock_sync_testing::Cluster;

const TTL: Duration = Duration::from_secs(10);
const PASSWORD: &str = "s3cret-Pw";

/// The nodes' URLs with their scheme replaced by `scheme`.
fn with_scheme(nodes: &Cluster, scheme: &str) -> Vec<String> {
    nodes
        .urls()
        .iter()
        .map(|url| {
            let (_, rest) = url.split_once("://").expect("a URL with a scheme");
            format!("{scheme}://{rest}")
        })
        .collect()
}

/// The nodes' URLs (`redis://127.0.0.1:PORT`) with `userinfo@` inserted.
fn with_userinfo(nodes: &Cluster, userinfo: &str) -> Vec<String> {
    nodes
        .urls()
        .iter()
        .map(|url| {
            let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
            format!("{scheme}://{userinfo}@{rest}")
        })
        .collect()
}

/// Makes every node of `nodes` require [`PASSWORD`]. The harness's own
/// inspection helpers connect without one, so they cannot be used after.
fn require_password(nodes: &Cluster) {
    for node in nodes.nodes() {
        node.query(&["CONFIG", "SET", "requirepass", PASSWORD])
            .expect("CONFIG SET requirepass");
    }
}

/// A client over `urls` that tries once, with the tests' roomy timeouts.
fn client_over(urls: Vec<String>) -> Redlock {
    Redlock::builder(urls)
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .expect("valid URLs")
}

/// The authentication errors of every node in `report`; fails if a node
/// failed otherwise.
fn auth_errors(report: &Report) -> Vec<(String, String, &'static str)> {
    report
        .nodes
        .iter()
        .map(|node| match &node.outcome {
            NodeOutcome::Failed(NodeError::Auth {
                node: named,
                reply,
                hint,
                ..
            }) => {
                assert_eq!(&**named, &*node.node, "the error names its node");
                (named.clone(), reply.clone(), *hint)
            }
            other => panic!(
                "{}: expected an authentication error, got {other}",
                node.node
            ),
        })
        .collect()
}

/// The report of a call that ended because the nodes cannot serve this
/// client: errors that waiting cannot fix.
fn unusable_report(result: Result<redlock_sync::Lock, LockError>) -> (String, Report) {
    match result {
        Err(e @ LockError::Unusable { .. }) => {
            let report = e.report().cloned().expect("a report");
            (e.to_string(), report)
        }
        other => panic!("expected the quorum error, got {other:?}"),
    }
}

#[test]
fn valkey_urls_reach_the_same_servers_as_redis_urls() {
    let nodes = cluster(3);
    let urls = with_scheme(&nodes, "valkey");
    let locks = client_over(urls);
    let lock = locks
        .try_acquire("valkey-url", TTL)
        .expect("granted over valkey://");
    let token = Some(lock.token().to_string());
    wait_until(SETTLE, "every node holds the lock's token", || {
        values(&nodes, "valkey-url") == vec![token.clone(); 3]
    });
    locks.release(lock).expect("released over valkey://");
}

#[cfg(unix)]
#[test]
fn valkey_unix_urls_reach_unix_socket_nodes() {
    let nodes = Cluster::start_unix(3).expect("three Unix-socket nodes");
    let urls = with_scheme(&nodes, "valkey+unix");
    let locks = Redlock::builder(urls)
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .expect("valkey+unix URLs are accepted");
    let lock = locks
        .try_acquire("valkey-unix-url", TTL)
        .expect("granted over valkey+unix://");
    assert!(lock.report().granted() >= locks.quorum());
    locks.release(lock).expect("released");
}

#[test]
fn the_right_password_after_a_colon_locks_and_releases() {
    let nodes = cluster(3);
    require_password(&nodes);
    let urls = with_userinfo(&nodes, &format!(":{PASSWORD}"));
    let locks = client_over(urls);
    let lock = locks.try_acquire("with-password", TTL).expect("granted");
    assert!(lock.report().granted() >= locks.quorum());
    let report = locks.release(lock).expect("released");
    assert!(report.granted() >= locks.quorum());
}

#[test]
fn a_wrong_password_is_an_authentication_error_naming_the_node_and_never_a_password() {
    let nodes = cluster(3);
    require_password(&nodes);
    let urls = with_userinfo(&nodes, ":wrong-Pw");
    let locks = client_over(urls);
    let (message, report) = unusable_report(locks.try_acquire("wrong-password", TTL));
    for (node, reply, hint) in auth_errors(&report) {
        assert!(reply.starts_with("WRONGPASS"), "{node}: {reply}");
        assert!(hint.contains("redis://:password@host"), "{node}: {hint}");
    }
    for secret in ["wrong-Pw", PASSWORD] {
        assert!(!message.contains(secret), "a password shows: {message}");
    }
    assert!(message.contains("refused authentication"), "{message}");
}

#[test]
fn a_password_without_its_colon_is_a_user_name_and_the_error_says_where_the_password_goes() {
    let nodes = cluster(3);
    require_password(&nodes);
    // `redis://s3cret@host` names the *user* s3cret, with no password: no
    // AUTH is sent, and the server answers NOAUTH.
    let urls = with_userinfo(&nodes, PASSWORD);
    let locks = client_over(urls);
    let (message, report) = unusable_report(locks.try_acquire("misplaced-password", TTL));
    for (node, reply, hint) in auth_errors(&report) {
        assert!(reply.starts_with("NOAUTH"), "{node}: {reply}");
        assert!(
            hint.contains("names a user but gives no password"),
            "{hint}"
        );
        assert!(hint.contains("redis://:password@host"), "{hint}");
    }
    assert!(!message.contains(PASSWORD), "the password shows: {message}");
}

#[test]
fn no_password_for_a_node_that_requires_one_says_how_to_give_it() {
    let nodes = cluster(3);
    require_password(&nodes);
    let locks = client_over(nodes.urls());
    let (_, report) = unusable_report(locks.try_acquire("no-password", TTL));
    for (node, reply, hint) in auth_errors(&report) {
        assert!(reply.starts_with("NOAUTH"), "{node}: {reply}");
        assert!(hint.contains("asks for a password"), "{hint}");
    }
}

#[test]
fn an_acl_user_with_its_password_locks_and_with_a_wrong_one_is_refused() {
    let nodes = cluster(3);
    for node in nodes.nodes() {
        node.query(&[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">locker-Pw",
            "~*",
            "+@all",
        ])
        .expect("ACL SETUSER");
    }
    let locks = client_over(with_userinfo(&nodes, "locker:locker-Pw"));
    let lock = locks.try_acquire("acl-user", TTL).expect("granted");
    // The user may not publish (new users have no channels since Redis 7):
    // the release still happens, only waiters are not told.
    locks.release(lock).expect("released");
    assert!(values(&nodes, "acl-user").iter().all(Option::is_none));
    // Nor may it subscribe: a waiter sleeps out its pause and still gets
    // the lock once it is free.
    let held = locks.try_acquire("acl-user", TTL).expect("granted");
    let waiter = Redlock::builder(with_userinfo(&nodes, "locker:locker-Pw"))
        .retry_policy(
            RetryPolicy::default()
                .retries(200)
                .delay(Duration::from_millis(20)),
        )
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| waiter.acquire("acl-user", TTL));
        std::thread::sleep(Duration::from_millis(100));
        locks.release(held).expect("released");
        let lock = waiting.join().unwrap().expect("acquired after its pause");
        waiter.release(lock).expect("released");
    });

    let wrong = client_over(with_userinfo(&nodes, "locker:nope-Pw"));
    let (message, report) = unusable_report(wrong.try_acquire("acl-user", TTL));
    for (node, reply, _) in auth_errors(&report) {
        assert!(reply.starts_with("WRONGPASS"), "{node}: {reply}");
    }
    assert!(
        !message.contains("nope-Pw"),
        "the password shows: {message}"
    );
}
