//! `inspect`: what each node holds, and a quorum's verdict, read without
//! writing, through the client's own connections and checks. Each holder
//! counts against its own kind's quorum.

mod common;

use std::time::{Duration, Instant};

use common::{builder, builder_over, cluster, contending_client, wait_until, SETTLE};
use redlock_sync::{Holding, Kind, Lock, LockError, LockOptions, NodeOutcome, Verdict};
use redlock_sync_testing::{Cluster, Node};

const TTL: Duration = Duration::from_secs(10);

/// A token-shaped value that no client of this crate holds.
const STRANGER: &str = "0123456789abcdef0123456789abcdef01234567";

fn permits(k: u32) -> LockOptions {
    LockOptions::new(TTL).kind(Kind::Semaphore(k))
}

fn shared() -> LockOptions {
    LockOptions::new(TTL).kind(Kind::Shared)
}

/// Whether `node` holds `lock`: a writer's key, or a member of the set
/// at its resource, whose value starts with its token (an owner label
/// follows).
fn holds(node: &Node, lock: &Lock) -> bool {
    let token = lock.token().to_string();
    let resource = &lock.resources()[0];
    if let Some(value) = node.get(resource).ok().flatten() {
        return value.starts_with(&token);
    }
    let members = node.query(&["ZRANGE", resource, "0", "-1"]).unwrap();
    let members: Vec<String> = redis::from_redis_value(members).unwrap();
    members.iter().any(|m| m.starts_with(&token))
}

/// Waits until every node holds `lock`: a round is decided once a quorum
/// granted, and the other nodes' grants land just after.
fn wait_until_held_everywhere(nodes: &Cluster, lock: &Lock) {
    wait_until(SETTLE, "every node holds the lock", || {
        nodes.nodes().iter().all(|n| holds(n, lock))
    });
}

/// The first 8 characters of `lock`'s token.
fn prefix(lock: &Lock) -> String {
    lock.token().to_string().chars().take(8).collect()
}

#[test]
fn inspect_tells_free_held_and_partly_held_resources_apart_and_writes_nothing() {
    let started = Instant::now();
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();

    let free = locks.inspect("free").unwrap();
    assert_eq!(free.verdict(), Verdict::Free);
    assert!(free.nodes.iter().all(|n| n.holding == Holding::Free));

    let lock = locks
        .acquire("held", LockOptions::new(TTL).owner("host-a:42"))
        .unwrap();
    wait_until_held_everywhere(&nodes, &lock);
    let held = locks.inspect("held").unwrap();
    let token = prefix(&lock);
    match held.verdict() {
        Verdict::Held { holder, quorum } => {
            assert_eq!((holder.token, holder.nodes, quorum), (token.clone(), 3, 2));
            assert_eq!(holder.owner.as_deref(), Some("host-a:42"));
            let ttl = holder.ttl.expect("a TTL");
            assert!(ttl <= TTL && ttl > TTL / 2, "{ttl:?}");
        }
        other => panic!("expected the writer, got {other:?}"),
    }
    for node in &held.nodes {
        match &node.holding {
            Holding::Held(h) => {
                let ttl = h.ttl.expect("a TTL");
                assert_eq!((&h.token, h.nodes), (&token, 1));
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
    nodes.node(0).set("partly", STRANGER).unwrap();
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
    assert!(
        matches!(seen.verdict(), Verdict::Held { ref holder, .. } if holder.nodes == 2),
        "{seen:?}"
    );

    // Two of three free and one unknown: free. One held, one free, one
    // unknown: the unknown node may complete a quorum.
    nodes.node(2).pause().unwrap();
    assert_eq!(locks.inspect("nothing").unwrap().verdict(), Verdict::Free);
    nodes.node(0).set("half", STRANGER).unwrap();
    assert_eq!(
        locks.inspect("half").unwrap().verdict(),
        Verdict::Unknown { quorum: 2 }
    );
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
    nodes.node(0).set("twice", STRANGER).unwrap();
    nodes.node(1).set("twice", STRANGER).unwrap();
    let seen = locks.inspect("twice").unwrap();
    let unknown = seen
        .nodes
        .iter()
        .filter(|n| matches!(n.holding, Holding::Unknown(_)))
        .count();
    assert_eq!(unknown, 1, "{seen:?}");
    // Held on two of the three nodes named, by two servers.
    assert!(
        matches!(seen.verdict(), Verdict::Held { ref holder, .. } if holder.nodes == 2),
        "{seen:?}"
    );
}

#[test]
fn a_permit_holder_is_held_on_its_own_quorum_and_free_below_it_when_every_node_answers() {
    let nodes = cluster(5);
    let locks = builder(&nodes)
        .io_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let lock = locks.acquire("pool", permits(2).owner("export-1")).unwrap();
    wait_until_held_everywhere(&nodes, &lock);
    let member = lock.token().to_string();

    // On 4 of 5 nodes: a 2-permit holder's quorum is 4.
    nodes.node(4).query(&["ZREM", "pool", &member]).unwrap();
    let seen = locks.inspect("pool").unwrap();
    assert_eq!(seen.quorum, 3, "the writers' quorum stays a majority");
    match seen.verdict() {
        Verdict::Shared {
            kind,
            holders,
            count,
            quorum,
        } => {
            assert_eq!((kind, count, quorum), (Kind::Semaphore(2), 1, 4));
            assert_eq!(holders[0].token, prefix(&lock));
            assert_eq!(holders[0].owner.as_deref(), Some("export-1"));
            assert_eq!(holders[0].nodes, 4);
        }
        other => panic!("expected the permit holder, got {other:?}"),
    }

    // On 3 of 5, every node answering: a majority, not its quorum, and no
    // silent node can add one. It does not hold: free.
    nodes.node(3).query(&["ZREM", "pool", &member]).unwrap();
    let seen = locks.inspect("pool").unwrap();
    assert_eq!(seen.verdict(), Verdict::Free, "{seen:?}");

    // With one node silent, that node could complete its quorum of 4.
    nodes.node(4).pause().unwrap();
    let seen = locks.inspect("pool").unwrap();
    nodes.node(4).resume().unwrap();
    assert_eq!(seen.verdict(), Verdict::Unknown { quorum: 4 }, "{seen:?}");
    let release = locks.release(lock);
    assert!(
        matches!(release, Err(LockError::Lost { .. })),
        "{release:?}"
    );
}

#[test]
fn an_applications_key_of_any_type_on_a_quorum_is_held_by_something_that_is_not_a_lock() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let writes: [(&str, &[&str]); 7] = [
        ("hash", &["HSET", "app", "field", "value"]),
        ("list", &["RPUSH", "app", "a", "b"]),
        ("set", &["SADD", "app", "a"]),
        ("stream", &["XADD", "app", "*", "field", "value"]),
        ("zset", &["ZADD", "app", "10", "alice", "20", "bob"]),
        ("string", &["SET", "app", "not a token"]),
        // Token-shaped but for a stray character after the token.
        ("string", &["SET", "app", &format!("{STRANGER}!")]),
    ];
    for (redis_type, write) in writes {
        for node in nodes.nodes() {
            node.query(&["DEL", "app"]).unwrap();
            node.query(write).unwrap();
        }
        let dumps: Vec<_> = (nodes.nodes().iter())
            .map(|n| n.query(&["DUMP", "app"]).unwrap())
            .collect();
        let seen = locks.inspect("app").unwrap();
        for node in &seen.nodes {
            let expected = Holding::NotALock {
                redis_type: redis_type.to_string(),
            };
            assert_eq!(node.holding, expected, "{write:?}");
        }
        let expected = Verdict::NotALock {
            redis_type: redis_type.to_string(),
            nodes: 3,
            quorum: 2,
        };
        assert_eq!(seen.verdict(), expected, "{write:?}");
        assert!(seen.verdict().holders().is_empty());
        let after: Vec<_> = (nodes.nodes().iter())
            .map(|n| n.query(&["DUMP", "app"]).unwrap())
            .collect();
        assert_eq!(dumps, after, "{write:?}: inspect writes nothing");
    }
    // On one node of three, with the others free: not a quorum, free.
    for node in &nodes.nodes()[1..] {
        node.query(&["DEL", "app"]).unwrap();
    }
    assert_eq!(locks.inspect("app").unwrap().verdict(), Verdict::Free);
}

#[test]
fn a_waiting_writers_intent_shows_on_each_node_and_in_the_inspection_with_its_time_left() {
    let nodes = cluster(3);
    let locks = contending_client(&nodes);
    let reader = locks.acquire("report", shared()).unwrap();
    assert_eq!(locks.inspect("report").unwrap().intent(), None);
    let writer_ttl = Duration::from_secs(8);
    std::thread::scope(|s| {
        let writer = s.spawn(|| locks.acquire("report", writer_ttl));
        wait_until(SETTLE, "a writer's intent on every node", || {
            (nodes.nodes().iter()).all(|n| {
                let key = redlock_sync::intents_key("report");
                let exists = n.query(&["EXISTS", &key]);
                exists.unwrap() == redis::Value::Int(1)
            })
        });
        let seen = locks.inspect("report").unwrap();
        let left = seen.intent().expect("readers held back");
        assert!(left <= writer_ttl && left > writer_ttl / 2, "{left:?}");
        assert!(seen.nodes.iter().all(|n| n.intent.is_some()), "{seen:?}");
        assert!(
            matches!(seen.verdict(), Verdict::Shared { count: 1, .. }),
            "{seen:?}"
        );
        locks.release(reader).unwrap();
        let writer = writer.join().unwrap().expect("the writer gets in");
        locks.release(writer).unwrap();
    });
    assert_eq!(locks.inspect("report").unwrap().intent(), None);
}

#[test]
fn the_verdict_names_each_holders_owner_time_left_and_nodes_and_counts_past_the_first_100() {
    let nodes = cluster(3);
    let locks = builder(&nodes).build().unwrap();
    let mut readers = Vec::new();
    // The last 20 expire after the first 100.
    for i in 0..120 {
        let owner = format!("reader-{i}");
        let ttl = if i < 100 { TTL } else { TTL * 2 };
        let options = LockOptions::new(ttl).kind(Kind::Shared).owner(&owner);
        readers.push(locks.acquire("catalog", options).unwrap());
    }
    for reader in &readers {
        wait_until_held_everywhere(&nodes, reader);
    }
    let verdict = locks.inspect("catalog").unwrap().verdict();
    let Verdict::Shared {
        kind,
        holders,
        count,
        quorum,
    } = &verdict
    else {
        panic!("expected readers, got {verdict:?}");
    };
    assert_eq!(
        (*kind, *count, *quorum, holders.len()),
        (Kind::Shared, 120, 2, 100)
    );
    // The first 100 by expiry: the readers with the shorter TTL.
    let mut shown: Vec<usize> = Vec::new();
    for h in holders {
        let owner = h.owner.as_deref().expect("an owner");
        let i: usize = owner["reader-".len()..].parse().unwrap();
        shown.push(i);
        assert_eq!(h.token, prefix(&readers[i]));
        assert_eq!(h.nodes, 3);
        let ttl = h.ttl.expect("a TTL");
        assert!(ttl <= TTL && ttl > TTL / 2, "{ttl:?}");
    }
    shown.sort_unstable();
    assert_eq!(shown, (0..100).collect::<Vec<_>>());
    let ttls: Vec<_> = holders.iter().map(|h| h.ttl).collect();
    assert!(ttls.windows(2).all(|w| w[0] <= w[1]), "{ttls:?}");
    assert_eq!(verdict.holders(), &holders[..]);
    assert_eq!(verdict.quorum(), Some(2));
    for reader in readers {
        locks.release(reader).unwrap();
    }
}
