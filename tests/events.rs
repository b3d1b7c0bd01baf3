//! The observer: the events of a contended acquisition, a failed
//! extension and a loss, in order, and never a password or a whole token;
//! through an outage, each change once (a node's failure, an operation's
//! run of failed rounds) with a count, never one event per round.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{builder_over, cluster};
use redlock_sync::{Cancel, Event, LockOptions, Patience, What};
use redlock_sync_testing::Fault;

const PASSWORD: &str = "s3cret-pw";

#[test]
fn the_observer_sees_contention_a_failed_extension_and_a_loss_without_passwords_or_tokens() {
    let started = Instant::now();
    let nodes = cluster(3);
    for node in nodes.nodes() {
        node.query(&["CONFIG", "SET", "requirepass", PASSWORD])
            .unwrap();
    }
    let proxies = nodes.proxies().unwrap();
    let with_password = |url: String| url.replace("redis://", &format!("redis://:{PASSWORD}@"));
    let holder = builder_over(nodes.urls().into_iter().map(with_password).collect())
        .build()
        .unwrap();
    let seen: Arc<Mutex<Vec<(What, String)>>> = Arc::default();
    let record = Arc::clone(&seen);
    let locks = builder_over(proxies.iter().map(|p| with_password(p.url())).collect())
        .retry_policy(common::quick_retries(200))
        .observer(move |event: &Event<'_>| {
            record
                .lock()
                .unwrap()
                .push((event.what, format!("{event:?}")));
        })
        .build()
        .unwrap();
    let whats = |from: usize| -> Vec<What> {
        seen.lock().unwrap()[from..]
            .iter()
            .map(|(w, _)| *w)
            .collect()
    };

    // Contended: refused until the holder releases, then won.
    let held = holder
        .acquire("contended", Duration::from_secs(10))
        .unwrap();
    let held_token = held.token().to_string();
    // Released once the waiter was refused at least once (not after a
    // sleep, which a slow first connect may outlast).
    let refused = Arc::clone(&seen);
    let release = std::thread::spawn(move || {
        common::wait_until(Duration::from_secs(10), "the waiter is refused", || {
            (refused.lock().unwrap().iter()).any(|(w, _)| *w == What::Contended)
        });
        holder.release(held).unwrap();
    });
    let lock = locks.acquire("contended", Duration::from_secs(10)).unwrap();
    release.join().unwrap();
    let acquired = whats(0);
    assert!(acquired.len() >= 2, "{acquired:?}");
    assert!(
        acquired[..acquired.len() - 1]
            .iter()
            .all(|w| *w == What::Contended),
        "{acquired:?}"
    );
    assert_eq!(acquired.last(), Some(&What::Acquired));
    let mut tokens = vec![held_token, lock.token().to_string()];
    let from = seen.lock().unwrap().len();
    locks.release(lock).unwrap();
    assert_eq!(whats(from), [What::Released]);

    // A guard whose extensions fail (two nodes cut off), then is lost.
    let ttl = Duration::from_millis(1500);
    let from = seen.lock().unwrap().len();
    let guard = locks.lock("guarded", ttl).unwrap();
    tokens.push(guard.token().to_string());
    for proxy in &proxies[..2] {
        proxy.set_fault(Fault::Partition);
    }
    assert!(guard.wait_lost(3 * ttl), "the guard was not lost");
    common::wait_until(ttl, "the loss event", || whats(from).contains(&What::Lost));
    let guarded = whats(from);
    assert_eq!(guarded[0], What::Acquired, "{guarded:?}");
    // The failed extension is told once (or not at all, when the round
    // that failed ended past the validity and lost the lock), after each
    // failing node, once; then the loss.
    let failed = guarded
        .iter()
        .position(|w| matches!(w, What::ExtendFailed | What::Lost));
    let failed = failed.unwrap_or_else(|| panic!("no failed extension: {guarded:?}"));
    assert_eq!(
        guarded[1..failed],
        [What::NodeFailed, What::NodeFailed],
        "each failing node comes first, once: {guarded:?}"
    );
    let told = |what| guarded.iter().filter(|w| **w == what).count();
    assert!(told(What::ExtendFailed) <= 1, "{guarded:?}");
    assert_eq!(told(What::Lost), 1, "{guarded:?}");
    assert_eq!(guarded.last(), Some(&What::Lost), "{guarded:?}");
    drop(guard);

    for (_, formatted) in seen.lock().unwrap().iter() {
        assert!(!formatted.contains(PASSWORD), "{formatted}");
        for token in &tokens {
            assert!(!formatted.contains(token.as_str()), "{formatted}");
            assert!(
                !formatted.contains(&token[..9]),
                "more than 8 characters: {formatted}"
            );
        }
    }
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_panicking_observer_does_not_reach_the_lock() {
    let nodes = cluster(3);
    let locks = common::builder(&nodes)
        .observer(|_: &Event<'_>| panic!("an observer that panics"))
        .build()
        .unwrap();
    let lock = locks.acquire("observed", Duration::from_secs(10)).unwrap();
    locks.release(lock).unwrap();
    locks
        .with_lock("observed", Duration::from_secs(10), |guard| guard.check())
        .unwrap();
}

#[test]
fn the_observer_is_told_which_node_re_took_a_key_it_had_lost() {
    let nodes = cluster(3);
    type Seen = Vec<(What, Option<String>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = Arc::clone(&seen);
    let locks = common::builder(&nodes)
        .observer(move |event: &Event<'_>| {
            let node = event.node.map(str::to_string);
            record.lock().unwrap().push((event.what, node));
        })
        .build()
        .unwrap();
    // A TTL roomy enough that a loaded machine's slow rounds leave the
    // guard its validity: the first extension comes after the restart.
    let guard = locks.lock("retaken", Duration::from_secs(3)).unwrap();
    // Node 2 restarts empty: it forgot the key.
    nodes.node(2).restart().unwrap();
    // Events name a node by its address, without the scheme.
    let restarted = nodes.node(2).url().replace("redis://", "");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let retook = (seen.lock().unwrap().iter()).any(|(what, node)| {
            *what == What::Retook && node.as_deref() == Some(restarted.as_str())
        });
        if retook {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no re-take told: {:?}",
            seen.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(guard.is_held());
    assert!(nodes.node(2).get("retaken").unwrap().is_some());
    guard.unlock().unwrap();
}

#[test]
fn a_leader_loop_through_a_ten_second_outage_of_three_of_five_nodes_is_told_in_a_few_short_events()
{
    const OUTAGE: Duration = Duration::from_secs(10);
    let started = Instant::now();
    let nodes = cluster(5);
    type Seen = Vec<(What, u32, Option<String>, String)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = Arc::clone(&seen);
    let locks = redlock_sync::Redlock::builder(nodes.urls())
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .observer(move |event: &Event<'_>| {
            let node = event.node.map(str::to_string);
            let told = (event.what, event.failures, node, format!("{event:?}"));
            record.lock().unwrap().push(told);
        })
        .build()
        .unwrap();
    let whats = |from: usize| -> Vec<What> {
        (seen.lock().unwrap()[from..].iter())
            .map(|(w, ..)| *w)
            .collect()
    };

    // The leader: leads while it holds the lock, then waits to win it back.
    let stop = Cancel::new();
    let options = LockOptions::new(Duration::from_secs(2))
        .patience(Patience::Forever)
        .cancel(&stop);
    let stopping = stop.clone();
    let leader = std::thread::spawn(move || {
        let mut terms = 0;
        while let Ok(guard) = locks.lock("leader", options.clone()) {
            terms += 1;
            while !guard.wait_lost(Duration::from_millis(50)) && !stopping.is_cancelled() {}
        }
        terms
    });
    common::wait_until(Duration::from_secs(10), "the leader leads", || {
        whats(0).contains(&What::Acquired)
    });

    let from = seen.lock().unwrap().len();
    for i in 0..3 {
        nodes.node(i).pause().unwrap();
    }
    std::thread::sleep(OUTAGE);
    for i in 0..3 {
        nodes.node(i).resume().unwrap();
    }
    common::wait_until(Duration::from_secs(10), "the leader leads again", || {
        whats(from).contains(&What::Acquired)
    });
    stop.cancel();
    let during: Seen = seen.lock().unwrap()[from..].to_vec();
    let lines: Vec<&str> = during.iter().map(|(.., line)| line.as_str()).collect();
    eprintln!("{} events:\n{}", lines.len(), lines.join("\n"));
    assert!(during.len() <= 30, "{} events: {lines:#?}", during.len());
    for line in &lines {
        assert!(line.len() <= 300, "{} characters: {line}", line.len());
    }
    // Each paused node failed once and recovered once, counting its rounds
    // (a busy machine may time a healthy node out too, now and then).
    let told = |what| during.iter().filter(move |(w, ..)| *w == what);
    for i in 0..3 {
        let paused = Some(nodes.node(i).url().replace("redis://", ""));
        let of = |what| told(what).filter(|(_, _, node, _)| *node == paused);
        assert_eq!(of(What::NodeFailed).count(), 1, "{paused:?}: {lines:#?}");
        let recovered: Vec<_> = of(What::NodeRecovered).map(|(_, n, ..)| *n).collect();
        assert!(
            matches!(recovered[..], [n] if n > 1),
            "{paused:?}: {lines:#?}"
        );
    }
    // The lock was lost once, and won back after failed rounds, counted.
    assert_eq!(told(What::Lost).count(), 1, "{lines:#?}");
    let won = told(What::Acquired).next_back().map(|(_, n, ..)| *n);
    assert!(won.is_some_and(|n| n > 1), "{lines:#?}");

    assert!(leader.join().unwrap() >= 2, "the leader led twice");
    assert!(started.elapsed() < Duration::from_secs(40));
}

#[test]
fn an_extension_by_hand_tells_the_observer_its_re_takes_and_its_outcome() {
    let nodes = cluster(3);
    // What the observer heard: the event, its node if any, its failures.
    type Told = Vec<(What, Option<String>, u32)>;
    let seen: Arc<Mutex<Told>> = Arc::default();
    let record = Arc::clone(&seen);
    let locks = common::builder(&nodes)
        .retry_policy(common::quick_retries(2))
        .observer(move |event: &Event<'_>| {
            let node = event.node.map(str::to_string);
            record
                .lock()
                .unwrap()
                .push((event.what, node, event.failures));
        })
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    let mut lock = locks.acquire("by-hand", ttl).unwrap();
    common::wait_until_held_by(&nodes, &lock, 3);
    // Node 2 lost the key: the extension re-takes it, and says so.
    nodes.node(2).flushall().unwrap();
    seen.lock().unwrap().clear();
    locks.extend(&mut lock, ttl).unwrap();
    let told: Vec<_> = seen.lock().unwrap().drain(..).collect();
    let node2 = format!("127.0.0.1:{}", nodes.node(2).port().unwrap());
    let retook = (told.iter())
        .filter(|(what, node, _)| *what == What::Retook && node.as_deref() == Some(&*node2));
    assert_eq!(retook.count(), 1, "{told:?}");
    assert_eq!(told.last().map(|t| t.0), Some(What::Extended), "{told:?}");
    // Two nodes gone: every round fails for want of answers, and the
    // observer hears of it once, then once more when the call gives up.
    nodes.node(0).kill().unwrap();
    nodes.node(1).kill().unwrap();
    assert!(locks.extend(&mut lock, ttl).is_err());
    let told: Vec<_> = seen.lock().unwrap().drain(..).collect();
    let failed: Vec<u32> = (told.iter())
        .filter(|(what, ..)| *what == What::ExtendFailed)
        .map(|(.., failures)| *failures)
        .collect();
    assert_eq!(failed, [1, 3], "{told:?}");
}

#[test]
fn one_acquisitions_events_carry_one_id_across_attempts_each_with_its_own_token() {
    let nodes = cluster(3);
    // Each event of the waiter: what, its acquisition's id, its token.
    type Told = Vec<(What, Option<String>, String)>;
    let seen: Arc<Mutex<Told>> = Arc::default();
    let record = Arc::clone(&seen);
    let waiter = common::builder(&nodes)
        .retry_policy(common::quick_retries(3))
        .observer(move |event: &Event<'_>| {
            let id = event.acquisition.map(str::to_string);
            let told = (event.what, id, event.token.to_string());
            record.lock().unwrap().push(told);
        })
        .build()
        .unwrap();
    let holder = common::client(&nodes);
    let held = holder.acquire("grouped", Duration::from_secs(10)).unwrap();
    assert!(waiter.acquire("grouped", Duration::from_secs(10)).is_err());
    holder.release(held).unwrap();
    let first = waiter.acquire("grouped", Duration::from_secs(10)).unwrap();
    waiter.release(first).unwrap();
    let told = seen.lock().unwrap().clone();
    let gave_up = told.iter().position(|t| t.0 == What::GaveUp).unwrap();
    let (waiting, rest) = told.split_at(gave_up + 1);
    let ids: Vec<_> = waiting.iter().map(|t| t.1.clone()).collect();
    assert!(
        ids.iter().all(|id| id.is_some() && *id == ids[0]),
        "{told:?}"
    );
    assert_eq!(ids[0].as_ref().map(String::len), Some(16), "{told:?}");
    let contended = waiting.iter().filter(|t| t.0 == What::Contended);
    let gave_up_token = &waiting.last().unwrap().2;
    assert!(contended.count() >= 1, "{told:?}");
    assert_ne!(
        &waiting[0].2, gave_up_token,
        "a token per attempt: {told:?}"
    );
    // The next acquisition has an id of its own; a release has none.
    let acquired = rest.iter().find(|t| t.0 == What::Acquired).unwrap();
    assert!(acquired.1.is_some() && acquired.1 != ids[0], "{told:?}");
    let released = rest.iter().find(|t| t.0 == What::Released).unwrap();
    assert_eq!(released.1, None, "{told:?}");
}

#[test]
fn an_extension_that_finds_the_lock_lost_tells_no_re_take() {
    let nodes = cluster(3);
    let seen: Arc<Mutex<Vec<What>>> = Arc::default();
    let record = Arc::clone(&seen);
    let locks = common::builder(&nodes)
        .observer(move |event: &Event<'_>| record.lock().unwrap().push(event.what))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    let mut lock = locks.acquire("lost-by-hand", ttl).unwrap();
    common::wait_until_held_by(&nodes, &lock, 3);
    // Two of three nodes lost the key: the round re-takes them, and the
    // lock is lost all the same.
    nodes.node(0).flushall().unwrap();
    nodes.node(1).flushall().unwrap();
    seen.lock().unwrap().clear();
    let result = locks.extend(&mut lock, ttl);
    assert!(
        matches!(result, Err(redlock_sync::LockError::Lost { .. })),
        "{result:?}"
    );
    let told = seen.lock().unwrap().clone();
    assert!(!told.contains(&What::Retook), "{told:?}");
    assert!(told.contains(&What::ExtendFailed), "{told:?}");
}
