//! Shared and counted locks held to their contract (`docs/contract.md`):
//! each waiting writer has an intent of its own, which only its acquisition
//! withdraws; an application's sorted set is never taken for a lock's; and a
//! holder whose entry is gone is told `Lost`, whatever holds the key now.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{builder, client, cluster, contending_client, wait_until};
use redlock_sync::{Kind, LockError, LockOptions, Loss, Patience, Redlock, RetryPolicy};
use redlock_sync_testing::{Cluster, Node};

const TTL: Duration = Duration::from_secs(10);

fn shared(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).kind(Kind::Shared)
}

fn permits(k: u32, ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).kind(Kind::Semaphore(k))
}

/// The key of a resource's writers' intents.
fn intents(resource: &str) -> String {
    redlock_sync::intents_key(resource)
}

/// The members of the sorted set `key` on `node`, with their scores.
fn members(node: &Node, key: &str) -> Vec<(String, f64)> {
    let reply = node
        .query(&["ZRANGE", key, "0", "-1", "WITHSCORES"])
        .expect("ZRANGE");
    let items: Vec<String> = redis::from_redis_value(reply).expect("strings");
    let pairs = items.chunks(2);
    pairs
        .map(|pair| (pair[0].clone(), pair[1].parse().expect("a score")))
        .collect()
}

/// The node's clock in ms, as a sorted set's scores count it.
fn node_now_ms(node: &Node) -> u64 {
    let reply = node.query(&["TIME"]).expect("TIME");
    let time: Vec<u64> = redis::from_redis_value(reply).expect("two numbers");
    time[0] * 1000 + time[1] / 1000
}

/// `DUMP key` on every node: what an application holds there, to compare.
fn dumps(nodes: &Cluster, key: &str) -> Vec<redis::Value> {
    let dump = |node: &Node| node.query(&["DUMP", key]).expect("DUMP");
    nodes.nodes().iter().map(dump).collect()
}

/// Whether `key` exists on `node`.
fn exists(node: &Node, key: &str) -> bool {
    node.query(&["EXISTS", key]).expect("EXISTS") == redis::Value::Int(1)
}

/// Whether `result` is `Contended`.
fn contended<T: std::fmt::Debug>(result: &Result<T, LockError>) -> bool {
    matches!(result, Err(LockError::Contended { .. }))
}

#[test]
fn a_writer_that_hears_no_release_gets_in_behind_overlapping_readers_and_a_short_writer() {
    writers_turn(true);
}

#[test]
fn a_writer_that_hears_no_release_gets_in_behind_a_stream_of_overlapping_readers() {
    writers_turn(false);
}

/// The schedule of the writer's turn. Four readers hold "stream" in turns
/// of 300 ms, overlapping, so it is never free. W1 (TTL 10 s, a retry every
/// second, no release notices) waits. With `short`, a second writer with a
/// 150 ms TTL tries twice and gives up, every 300 ms. W1 must get in within
/// its bound: the readers in when its intent landed (300 ms), the short
/// writer's holds, and one pause (1 s), after its first two attempts (1 s).
fn writers_turn(short: bool) {
    let nodes = cluster(5);
    let readers = contending_client(&nodes);
    let deaf: Vec<String> = nodes.nodes().iter().map(common::deaf_url).collect();
    let w1 = Redlock::builder(deaf)
        .retry_policy(
            RetryPolicy::default()
                .retries(100)
                .delay(Duration::from_secs(1))
                .jitter(Duration::ZERO),
        )
        .max_wait(Duration::from_secs(20))
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .expect("W1's client");
    let w2 = builder(&nodes).build().expect("W2's client");
    let stop = AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    let waited = std::thread::scope(|s| {
        for i in 0..4 {
            let readers = &readers;
            let stop = &stop;
            let reads = &reads;
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(75 * i));
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(lock) = readers.acquire("stream", shared(TTL)) {
                        reads.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(300));
                        let _ = readers.release(lock);
                    }
                }
            });
        }
        if short {
            let w2 = &w2;
            let stop = &stop;
            s.spawn(move || {
                let once =
                    LockOptions::new(Duration::from_millis(150)).patience(Patience::Retries(1));
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(lock) = w2.acquire("stream", once.clone()) {
                        let _ = w2.release(lock);
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            });
        }
        wait_until(Duration::from_secs(10), "readers overlap", || {
            reads.load(Ordering::Relaxed) >= 8
        });
        let start = Instant::now();
        let won = w1.acquire("stream", TTL);
        let waited = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let lock = won.expect("W1 gets in");
        w1.release(lock).expect("W1 releases");
        waited
    });
    // Without an intent of its own, W1 waited past 8 s in every run.
    assert!(
        waited < Duration::from_secs(4),
        "W1 waited {waited:?}: over its bound of about 2.5 s"
    );
}

#[test]
fn a_writer_that_gives_up_withdraws_its_intent_so_the_next_reader_needs_no_ttl() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let reader = locks.acquire("lobby", shared(TTL)).expect("a reader");
    let brief = LockOptions::new(TTL).patience(Patience::Retries(1));
    let writer = locks.acquire("lobby", brief);
    assert!(contended(&writer), "{writer:?}");
    // Its second attempt marked its intent; giving up withdrew it.
    wait_until(Duration::from_secs(2), "the intents are withdrawn", || {
        let empty = |node: &Node| members(node, &intents("lobby")).is_empty();
        nodes.nodes().iter().all(empty)
    });
    locks.release(reader).expect("the reader leaves");
    let next = locks.try_acquire("lobby", shared(TTL));
    locks.release(next.expect("the next reader, at once")).ok();
}

#[test]
fn a_shorter_or_later_writer_never_shortens_nor_withdraws_another_writers_intent() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let reader = locks.acquire("hall", shared(TTL)).expect("a reader");
    let long = LockOptions::new(Duration::from_secs(30)).patience(Patience::Retries(1));
    assert!(contended(&locks.acquire("hall", long)));
    // The long writer gave up and withdrew its intent; leave one by hand,
    // as a writer still waiting would have it.
    let node = nodes.node(0);
    let until = (node_now_ms(node) + 30_000).to_string();
    node.query(&["ZADD", &intents("hall"), &until, "00000000000000aa"])
        .expect("ZADD");
    node.query(&["PEXPIREAT", &intents("hall"), &until])
        .expect("PEXPIREAT");
    let short = LockOptions::new(Duration::from_millis(150)).patience(Patience::Retries(1));
    assert!(contended(&locks.acquire("hall", short)));
    let writer_left = |node: &Node| {
        let left = members(node, &intents("hall"));
        left.len() == 1 && left[0].0 == "00000000000000aa"
    };
    wait_until(
        Duration::from_secs(2),
        "only the waiting writer's intent is left",
        || writer_left(node),
    );
    assert!(
        node.pttl(&intents("hall")).unwrap() > 25_000,
        "the key lives as its intent"
    );
    // A writer that wins and releases leaves it too.
    locks.release(reader).expect("the reader leaves");
    let writer = locks.try_acquire("hall", TTL).expect("a writer");
    locks.release(writer).expect("the writer leaves");
    assert!(writer_left(node), "{:?}", members(node, &intents("hall")));
    // It keeps new readers out on node 0: with node 2 down, none gets in.
    nodes.node(2).pause().expect("pause");
    let reader = locks.try_acquire("hall", shared(TTL));
    nodes.node(2).resume().expect("resume");
    assert!(contended(&reader), "{reader:?}");
}

#[test]
fn an_older_clients_intent_string_keeps_readers_out_and_keeps_its_type() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    for node in nodes.nodes() {
        node.query(&["SET", "redlock-sync:intent:gate", "1", "PX", "10000"])
            .expect("SET");
    }
    assert!(contended(&locks.try_acquire("gate", shared(TTL))));
    assert!(contended(&locks.try_acquire("gate", permits(2, TTL))));
    for node in nodes.nodes() {
        let kind = node.query(&["TYPE", "redlock-sync:intent:gate"]).unwrap();
        assert_eq!(kind, redis::Value::SimpleString("string".into()));
        node.query(&["DEL", "redlock-sync:intent:gate"]).unwrap();
    }
    let reader = locks.try_acquire("gate", shared(TTL)).expect("admitted");
    locks.release(reader).expect("release");
}

/// The application's sorted set `R` on every node, after `setup` ended
/// the lock's: nothing is granted on it, of any kind, and it stays as the
/// application wrote it.
fn an_applications_set_stays_its_own(nodes: &Cluster, locks: &Redlock, resource: &str) {
    for node in nodes.nodes() {
        node.query(&["ZADD", resource, "1", "x", "2", "y"])
            .expect("the application's ZADD");
    }
    let before = dumps(nodes, resource);
    for options in [shared(TTL), permits(2, TTL), permits(1, TTL)] {
        let result = locks.try_acquire(resource, options);
        assert!(contended(&result), "{result:?}");
    }
    assert!(contended(&locks.try_acquire(resource, TTL)));
    assert_eq!(
        dumps(nodes, resource),
        before,
        "the application's set changed"
    );
    for node in nodes.nodes() {
        assert_eq!(node.pttl(resource).unwrap(), -1, "an expiry was set");
    }
}

#[test]
fn an_applications_sorted_set_written_after_the_last_release_is_never_taken_for_a_lock() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    for (i, options) in [shared(TTL), permits(2, TTL)].into_iter().enumerate() {
        let resource = format!("after-release-{i}");
        let one = locks.acquire(&resource, options.clone()).expect("a holder");
        let two = locks.acquire(&resource, options).expect("another");
        locks.release(one).expect("release");
        locks.release(two).expect("release");
        wait_until(
            Duration::from_secs(2),
            "the last release left no key",
            || nodes.nodes().iter().all(|node| !exists(node, &resource)),
        );
        an_applications_set_stays_its_own(&nodes, &locks, &resource);
    }
}

#[test]
fn an_applications_sorted_set_written_after_a_clean_up_emptied_the_set_is_never_taken() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    for (i, options) in [shared(TTL), permits(2, TTL)].into_iter().enumerate() {
        let resource = format!("after-clean-up-{i}");
        // A writer's key on nodes 1 and 2: node 0 admits, then cleans up.
        for node in &nodes.nodes()[1..] {
            node.set(&resource, "ffffffffffffffffffffffffffffffffffffffff")
                .unwrap();
        }
        assert!(contended(&locks.try_acquire(&resource, options)));
        wait_until(
            Duration::from_secs(2),
            "the clean-up emptied node 0",
            || !exists(nodes.node(0), &resource),
        );
        for node in &nodes.nodes()[1..] {
            node.query(&["DEL", &resource]).unwrap();
        }
        an_applications_set_stays_its_own(&nodes, &locks, &resource);
    }
}

#[test]
fn an_applications_del_then_zadd_under_live_holders_is_never_taken_for_a_lock() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    for (i, options) in [shared(TTL), permits(2, TTL)].into_iter().enumerate() {
        let resource = format!("deleted-{i}");
        let mut holder = locks.acquire(&resource, options).expect("a holder");
        for node in nodes.nodes() {
            node.query(&["DEL", &resource]).unwrap();
        }
        an_applications_set_stays_its_own(&nodes, &locks, &resource);
        let lost = locks.extend(&mut holder, TTL);
        assert!(
            matches!(
                lost,
                Err(LockError::Lost {
                    reason: Loss::Gone(3),
                    ..
                })
            ),
            "{lost:?}"
        );
        let before = dumps(&nodes, &resource);
        let _ = locks.release(holder);
        assert_eq!(dumps(&nodes, &resource), before, "a release wrote it");
    }
}

/// Deletes `resource` on nodes 0 to 3 of 5 (a flush of that key), then a
/// reader takes it there: the 2-permit holder's member is gone on four.
fn readers_take_four_of_five(nodes: &Cluster, resource: &str) -> redlock_sync::Lock {
    for node in &nodes.nodes()[..4] {
        node.query(&["DEL", resource]).unwrap();
    }
    let locks = client(nodes);
    locks
        .acquire(resource, shared(TTL))
        .expect("readers take four nodes")
}

#[test]
fn a_permit_holder_whose_nodes_went_to_readers_is_told_lost_not_unusable() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let mut holder = locks.acquire("print", permits(2, TTL)).expect("a permit");
    let _reader = readers_take_four_of_five(&nodes, "print");
    let lost = locks.extend(&mut holder, TTL);
    assert!(
        matches!(
            lost,
            Err(LockError::Lost {
                reason: Loss::Gone(4),
                ..
            })
        ),
        "{lost:?}"
    );
    let released = locks.release(holder);
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "{released:?}"
    );
}

#[test]
fn a_permit_guard_whose_nodes_went_to_readers_is_told_at_its_next_extension() {
    let nodes = cluster(5);
    let locks = builder(&nodes)
        .extend_when_left(0.5)
        .build()
        .expect("a client");
    let ttl = Duration::from_secs(2);
    let guard = locks.lock("scan", permits(2, ttl)).expect("a permit guard");
    let _reader = readers_take_four_of_five(&nodes, "scan");
    let start = Instant::now();
    assert!(guard.wait_lost(Duration::from_secs(5)), "never told");
    let told = start.elapsed();
    let error = guard.check().expect_err("lost");
    assert!(
        matches!(
            error,
            LockError::Lost {
                reason: Loss::Gone(4),
                ..
            }
        ),
        "told by its validity's end, not an extension: {error:?}"
    );
    // The next extension comes when half of the 2 s is left.
    assert!(told < Duration::from_millis(1_500), "told after {told:?}");
}

#[test]
fn a_node_where_the_member_is_gone_answers_gone_whatever_kind_holds_it_now() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let mut reader = locks.acquire("shelf", shared(TTL)).expect("a reader");
    for node in nodes.nodes() {
        node.query(&["DEL", "shelf"]).unwrap();
    }
    let permit = locks.acquire("shelf", permits(3, TTL)).expect("a permit");
    let lost = locks.extend(&mut reader, TTL);
    assert!(
        matches!(
            lost,
            Err(LockError::Lost {
                reason: Loss::Gone(3),
                ..
            })
        ),
        "{lost:?}"
    );
    locks.release(permit).expect("release");
}
