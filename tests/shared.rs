//! Shared and counted locks ([`Kind::Shared`], [`Kind::Semaphore`]) on real
//! nodes: readers share and exclude writers, a waiting writer is not
//! starved, a semaphore admits at most K holders even where a simple
//! majority of nodes would admit more, and the kinds keep apart.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{client, cluster, contending_client, wait_until};
use redlock_sync::{
    ArgumentError, Holding, Kind, Lock, LockError, LockOptions, NodeError, NodeOutcome, Verdict,
};

const TTL: Duration = Duration::from_secs(10);

fn shared(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).kind(Kind::Shared)
}

fn permits(k: u32, ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).kind(Kind::Semaphore(k))
}

/// Whether `result` failed because the nodes hold the resource as another
/// kind.
fn other_kind<T: std::fmt::Debug>(result: Result<T, LockError>) -> bool {
    match result {
        Err(LockError::Unusable { report, .. }) => report
            .nodes
            .iter()
            .any(|n| matches!(&n.outcome, NodeOutcome::Failed(NodeError::OtherKind(_)))),
        other => panic!("expected the other kind's error, got {other:?}"),
    }
}

#[test]
fn readers_hold_together_and_a_writer_waits_until_the_last_one_leaves() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let one = locks.acquire("book", shared(TTL)).expect("a first reader");
    let two = locks
        .acquire("book", shared(TTL))
        .expect("a second reader at once");
    assert_eq!(two.fencing_token(), None, "readers get no fencing token");
    let writer = locks.try_acquire("book", TTL);
    assert!(
        matches!(writer, Err(LockError::Contended { .. })),
        "{writer:?}"
    );
    let fenced = locks.try_acquire("book", LockOptions::new(TTL).kind(Kind::Fenced));
    assert!(
        matches!(fenced, Err(LockError::Contended { .. })),
        "{fenced:?}"
    );
    locks.release(one).expect("the first reader leaves");
    assert!(
        locks.try_acquire("book", TTL).is_err(),
        "one reader still holds"
    );
    locks.release(two).expect("the second reader leaves");
    let writer = locks.try_acquire("book", TTL).expect("no reader left");
    let reader = locks.try_acquire("book", shared(TTL));
    assert!(
        matches!(reader, Err(LockError::Contended { .. })),
        "{reader:?}"
    );
    locks.release(writer).expect("the writer leaves");
    let reader = locks
        .try_acquire("book", shared(TTL))
        .expect("the writer left");
    locks.release(reader).expect("release");
}

#[test]
fn the_readers_key_expires_with_its_last_live_reader_so_a_writer_needs_no_purge() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let short = locks
        .acquire("page", shared(Duration::from_millis(300)))
        .expect("a short reader");
    let long = locks.acquire("page", shared(TTL)).expect("a long reader");
    locks.release(long).expect("the long reader leaves");
    // Only the short reader lives: the key must expire with it.
    for node in nodes.nodes() {
        let ms = node.pttl("page").expect("PTTL");
        assert!(
            (0..=300).contains(&ms),
            "the key outlives its last reader: {ms} ms"
        );
    }
    let start = Instant::now();
    wait_until(Duration::from_secs(5), "the writer gets in", || {
        locks
            .try_acquire("page", TTL)
            .map(|l| locks.release(l))
            .is_ok()
    });
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(short);
}

#[test]
fn a_waiting_writer_is_not_kept_out_by_a_steady_stream_of_readers() {
    writer_not_starved(LockOptions::new(TTL));
    writer_not_starved(LockOptions::new(TTL).kind(Kind::Fenced));
}

/// A writer taken with `options` gets in within 2 s of a stream of readers.
fn writer_not_starved(options: LockOptions) {
    let nodes = cluster(3);
    let locks = contending_client(&nodes);
    let (stop, reads) = (AtomicBool::new(false), AtomicUsize::new(0));
    let (waited, intents) = std::thread::scope(|s| {
        for i in 0..6 {
            let (locks, stop, reads) = (&locks, &stop, &reads);
            s.spawn(move || {
                // Six readers, staggered, each holding 50 ms and back after
                // 1 ms: the resource is never without a reader.
                std::thread::sleep(Duration::from_millis(10 * i));
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(lock) = locks.acquire("stream", shared(TTL)) {
                        reads.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(50));
                        let _ = locks.release(lock);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
        }
        wait_until(Duration::from_secs(10), "readers flow", || {
            reads.load(Ordering::Relaxed) > 20
        });
        let start = Instant::now();
        let locks = &locks;
        let writer = s.spawn(move || {
            locks
                .acquire("stream", options)
                .map(|l| (l, start.elapsed()))
        });
        // The stream goes on for 5 s, or until the writer got in.
        let mut intents = 0;
        while !writer.is_finished() && start.elapsed() < Duration::from_secs(5) {
            let intent = |n: &redlock_sync_testing::Node| {
                let key = redlock_sync::intents_key("stream");
                let exists = n.query(&["EXISTS", &key]);
                exists.unwrap() == redis::Value::Int(1)
            };
            intents = intents.max(nodes.nodes().iter().filter(|n| intent(n)).count());
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, Ordering::Relaxed);
        let (lock, waited) = writer.join().unwrap().expect("the writer gets in");
        locks.release(lock).expect("release");
        (waited, intents)
    });
    // The rule: from the writer's second attempt on, no new reader joins;
    // those inside leave within their 50 ms hold.
    assert!(
        waited < Duration::from_secs(2),
        "the writer waited {waited:?} (intents seen on {intents} nodes)"
    );
}

#[test]
fn a_semaphore_admits_k_holders_and_the_next_one_when_a_permit_comes_back() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let a = locks.acquire("pool", permits(2, TTL)).expect("permit 1");
    let b = locks.acquire("pool", permits(2, TTL)).expect("permit 2");
    let c = locks.try_acquire("pool", permits(2, TTL));
    assert!(matches!(c, Err(LockError::Contended { .. })), "{c:?}");
    match locks.inspect("pool").expect("inspect").verdict() {
        Verdict::Shared { kind, count, .. } => {
            assert_eq!((kind, count), (Kind::Semaphore(2), 2));
        }
        other => panic!("expected two holders, got {other:?}"),
    }
    assert_eq!(a.report().quorum, 4, "K = 2 on 5 nodes needs 4");
    locks.release(a).expect("a permit comes back");
    let c = locks
        .try_acquire("pool", permits(2, TTL))
        .expect("the freed permit");
    for lock in [b, c] {
        locks.release(lock).expect("release");
    }
}

#[test]
fn three_holders_of_two_permits_each_on_a_simple_majority_are_not_admitted() {
    // A simple-majority semaphore admits A on nodes 0-2, B on 2-4 and C on
    // 0, 1, 3, 4: no node counts more than 2, yet 3 hold. Each needs 4 of 5
    // nodes here, so with those nodes reachable none is admitted.
    let nodes = cluster(5);
    // A client a step: none inherits another's connect backoff; each stays
    // until the end, so that its clean-ups reach the resumed nodes.
    let (mut held, mut clients) = (Vec::new(), Vec::new());
    for paused in [&[3, 4][..], &[0, 1], &[2]] {
        for &i in paused {
            nodes.node(i).pause().expect("pause");
        }
        let locks = client(&nodes);
        let attempt = locks.try_acquire("trio", permits(2, TTL));
        clients.push(locks);
        for &i in paused {
            nodes.node(i).resume().expect("resume");
        }
        held.extend(attempt.ok());
    }
    assert!(held.len() <= 2, "{} holders of 2 permits", held.len());
    wait_until(Duration::from_secs(5), "no node counts more than 2", || {
        nodes.nodes().iter().all(|n| {
            let count: i64 = redis::from_redis_value(n.query(&["ZCARD", "trio"]).unwrap()).unwrap();
            count <= 2
        })
    });
    // And where 4 nodes are up each time, 2 get in and the third does not.
    let mut held = Vec::new();
    for paused in [4, 0, 2] {
        nodes.node(paused).pause().expect("pause");
        let locks = client(&nodes);
        held.extend(locks.try_acquire("quad", permits(2, TTL)).ok());
        clients.push(locks);
        nodes.node(paused).resume().expect("resume");
    }
    assert_eq!(held.len(), 2, "two permits, two holders");
}

#[test]
fn kinds_keep_apart_with_a_typed_error() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let two = locks.acquire("gate", permits(2, TTL)).expect("a permit");
    assert!(other_kind(locks.try_acquire("gate", permits(3, TTL))));
    assert!(other_kind(locks.try_acquire("gate", shared(TTL))));
    // Releasing with the wrong kind is refused, and the permit stays.
    let wrong = Lock::from_token("gate", *two.token(), Kind::Plain).unwrap();
    assert!(other_kind(locks.release(wrong)));
    let reader = locks.acquire("desk", shared(TTL)).expect("a reader");
    assert!(other_kind(locks.try_acquire("desk", permits(1, TTL))));
    let wrong = Lock::from_token("desk", *reader.token(), Kind::Semaphore(1)).unwrap();
    assert!(other_kind(locks.release(wrong)));
    let writer = locks.acquire("door", TTL).expect("a writer");
    let wrong = Lock::from_token("door", *writer.token(), Kind::Shared).unwrap();
    assert!(other_kind(locks.release(wrong)));
    for lock in [two, reader, writer] {
        locks.release(lock).expect("the right kind releases");
    }
}

#[test]
fn bad_shared_and_counted_settings_are_refused_with_argument_errors() {
    let nodes = cluster(1);
    let locks = client(&nodes);
    let refused = |result: Result<Lock, LockError>| match result {
        Err(LockError::Argument(e)) => e,
        other => panic!("expected an argument error, got {other:?}"),
    };
    assert_eq!(
        refused(locks.acquire("z", permits(0, TTL))),
        ArgumentError::ZeroPermits
    );
    assert_eq!(
        refused(locks.acquire(["a", "b"], shared(TTL))),
        ArgumentError::OneResource("shared")
    );
    assert_eq!(
        refused(locks.acquire(["a", "b"], permits(2, TTL))),
        ArgumentError::OneResource("semaphore")
    );
    for bad in ["", "tab\there", &"x".repeat(201)] {
        let options = LockOptions::new(TTL).owner(bad);
        assert_eq!(
            refused(locks.acquire("o", options)),
            ArgumentError::Owner(bad.into())
        );
    }
}

#[test]
fn owner_labels_are_stored_with_every_kind_and_shown_by_inspect() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let writer = locks
        .acquire("w", LockOptions::new(TTL).owner("host-a:42"))
        .expect("a labelled writer");
    let view = locks.inspect("w").expect("inspect");
    for node in &view.nodes {
        match &node.holding {
            Holding::Held(h) => assert_eq!(h.owner.as_deref(), Some("host-a:42")),
            other => panic!("expected the writer, got {other:?}"),
        }
    }
    let mut writer = writer;
    locks
        .extend(&mut writer, TTL)
        .expect("a labelled lock extends");
    let reader = locks
        .acquire("r", shared(TTL).owner("host-b:7"))
        .expect("a labelled reader");
    for node in locks.inspect("r").expect("inspect").nodes {
        match node.holding {
            Holding::Shared { kind, holders, .. } => {
                assert_eq!(kind, Kind::Shared);
                assert_eq!(holders[0].owner.as_deref(), Some("host-b:7"));
            }
            other => panic!("expected the reader, got {other:?}"),
        }
    }
    for lock in [writer, reader] {
        locks.release(lock).expect("release");
    }
}

#[test]
fn a_reader_extends_and_is_lost_when_a_majority_lost_its_entry() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let mut reader = locks
        .acquire("shelf", shared(Duration::from_secs(2)))
        .expect("reader");
    locks.extend(&mut reader, TTL).expect("extends");
    assert!(reader.validity() > Duration::from_secs(5));
    for i in [0, 1] {
        nodes.node(i).flushall().expect("flush");
    }
    match locks.extend(&mut reader, TTL) {
        Err(LockError::Lost { .. }) => {}
        other => panic!("expected Lost, got {other:?}"),
    }
}

#[test]
fn shared_and_counted_guards_are_kept_past_their_ttl_by_the_watchdog() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let ttl = Duration::from_millis(600);
    let reader = locks.lock("long", shared(ttl)).expect("a reader guard");
    let holder = locks.lock("sem", permits(1, ttl)).expect("a permit guard");
    std::thread::sleep(ttl * 3);
    assert!(reader.is_held() && holder.is_held(), "kept alive");
    let other = locks.try_acquire("sem", permits(1, ttl));
    assert!(
        matches!(other, Err(LockError::Contended { .. })),
        "{other:?}"
    );
    reader.unlock().expect("held throughout");
    holder.unlock().expect("held throughout");
}

/// How many scripts node `i` has run.
fn commands_run(nodes: &redlock_sync_testing::Cluster, i: usize) -> u64 {
    common::calls(nodes, i, &["evalsha", "eval"])
}

#[test]
fn an_uncontended_shared_or_counted_acquisition_is_one_round() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    // A first lock opens the connections (their handshake loads scripts).
    locks.release(locks.acquire("warm", TTL).unwrap()).unwrap();
    for options in [shared(TTL), permits(3, TTL)] {
        let before: Vec<u64> = (0..3).map(|i| commands_run(&nodes, i)).collect();
        let lock = locks.acquire("once", options).expect("uncontended");
        let after: Vec<u64> = (0..3).map(|i| commands_run(&nodes, i)).collect();
        // One script a node; INFO itself is not counted here.
        for (b, a) in before.iter().zip(&after) {
            assert!(a - b <= 1, "{before:?} -> {after:?}");
        }
        assert!(after.iter().zip(&before).filter(|(a, b)| a > b).count() >= 2);
        locks.release(lock).expect("release");
    }
}

#[test]
fn a_waiter_for_a_permit_is_woken_by_the_release_not_by_its_pause() {
    let nodes = cluster(3);
    let holder = client(&nodes);
    let held = holder.acquire("slot", permits(1, TTL)).expect("the permit");
    let waiter = common::slow_retrying_client(&nodes);
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let got = waiter.acquire("slot", permits(1, TTL));
            (got, Instant::now())
        });
        // Its first attempt failed, and it listens for the release.
        wait_until(Duration::from_secs(5), "the waiter listens", || {
            common::listeners(&nodes, 0, "slot") > 0
        });
        let released = Instant::now();
        holder.release(held).expect("release");
        let (got, at) = waiting.join().unwrap();
        waiter.release(got.expect("woken")).expect("release");
        // Its pause is 10 s: it came at the news.
        assert!(
            at - released < Duration::from_secs(3),
            "{:?}",
            at - released
        );
    });
}

#[test]
fn plain_scripts_take_a_readers_key_for_another_holder_not_for_a_node_error() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let reader = locks.acquire("mixed", shared(TTL)).expect("a reader");
    let stranger = redlock_sync::Token::random().unwrap();
    let mut writer = Lock::from_token("mixed", stranger, Kind::Plain).unwrap();
    match locks.extend(&mut writer, TTL) {
        Err(LockError::Lost { report, .. }) => {
            assert_eq!(report.refused(), 3, "{report:?}");
        }
        other => panic!("expected Lost, refused everywhere: {other:?}"),
    }
    let fenced = Lock::from_token("mixed", stranger, Kind::Fenced).unwrap();
    match locks.release(fenced) {
        Err(LockError::Lost { report, .. }) => assert_eq!(report.failed(), 0, "{report:?}"),
        other => panic!("expected Lost, refused everywhere: {other:?}"),
    }
    let view = locks.inspect("mixed").expect("inspect");
    assert!(matches!(view.verdict(), Verdict::Shared { .. }), "{view:?}");
    let rows = locks.with_lock("mixed", shared(TTL), |_| Ok::<_, LockError>(7));
    assert_eq!(rows.expect("a second reader in a closure"), 7);
    locks.release(reader).expect("release");
}

#[test]
fn an_applications_sorted_set_at_the_resource_is_another_holder_and_left_untouched() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    for node in nodes.nodes() {
        node.query(&["ZADD", "board", "10", "alice", "20", "bob"])
            .unwrap();
    }
    let reader = locks.try_acquire("board", shared(TTL));
    assert!(
        matches!(reader, Err(LockError::Contended { .. })),
        "{reader:?}"
    );
    let permit = locks.try_acquire("board", permits(2, TTL));
    assert!(
        matches!(permit, Err(LockError::Contended { .. })),
        "{permit:?}"
    );
    for node in nodes.nodes() {
        let members: Vec<String> =
            redis::from_redis_value(node.query(&["ZRANGE", "board", "0", "-1"]).unwrap()).unwrap();
        assert_eq!(members, ["alice", "bob"]);
        assert_eq!(node.pttl("board").unwrap(), -1, "no expiry was set");
    }
    let view = locks.inspect("board").expect("inspect");
    let not_a_lock = Verdict::NotALock {
        redis_type: "zset".to_string(),
        nodes: 3,
        quorum: 2,
    };
    assert_eq!(view.verdict(), not_a_lock, "{view:?}");
}

#[test]
fn a_writers_release_leaves_another_writers_intent_which_keeps_readers_out_until_it_expires() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    // Node 0 holds a reader's entry (of a reader that reached no quorum),
    // and the intent of another writer that waits there for 1 s.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let now = now.unwrap().as_millis();
    let reader_until = (now + TTL.as_millis()).to_string();
    let intent_until = (now + 1_000).to_string();
    let stray = "0123456789abcdef0123456789abcdef01234567";
    let node = nodes.node(0);
    let set = [
        "ZADD",
        "hall",
        "-inf",
        "redlock-sync:2:kind=0",
        &reader_until,
        stray,
    ];
    node.query(&set).unwrap();
    let intents = &redlock_sync::intents_key("hall");
    node.query(&["ZADD", intents, &intent_until, "00000000000000aa"])
        .unwrap();
    node.query(&["PEXPIREAT", intents, &intent_until]).unwrap();
    let writer = locks.try_acquire("hall", TTL).expect("nodes 1 and 2 grant");
    locks.release(writer).expect("release");
    let exists = node.query(&["EXISTS", intents]).unwrap();
    assert_eq!(exists, redis::Value::Int(1), "only its writer withdraws it");
    // With node 2 down, readers need node 0: the intent keeps them out
    // until it expires.
    nodes.node(2).pause().expect("pause");
    let refused = locks.try_acquire("hall", shared(TTL));
    assert!(
        matches!(refused, Err(LockError::Contended { .. })),
        "{refused:?}"
    );
    wait_until(Duration::from_secs(3), "a reader gets in", || {
        let reader = locks.try_acquire("hall", shared(TTL));
        reader.map(|r| locks.release(r)).is_ok()
    });
    nodes.node(2).resume().expect("resume");
}

#[test]
fn extending_with_the_wrong_kind_is_refused_and_changes_nothing() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let reader = locks.acquire("desk", shared(TTL)).expect("a reader");
    let mut wrong = Lock::from_token("desk", *reader.token(), Kind::Plain).unwrap();
    assert!(other_kind(locks.extend(&mut wrong, TTL)));
    let writer = locks.acquire("door", TTL).expect("a writer");
    let mut wrong = Lock::from_token("door", *writer.token(), Kind::Shared).unwrap();
    assert!(other_kind(locks.extend(&mut wrong, TTL)));
    for lock in [reader, writer] {
        locks
            .release(lock)
            .expect("still held: nothing was cleaned up");
    }
}
