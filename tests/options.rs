//! Per-call options against real nodes: what to lock in every accepted
//! form, kinds, patience, the retry policy's backoff, cancellation, and the
//! errors that end every wait at once.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client, cluster, fenced, values, wait_until, SETTLE};
use redlock_sync::{
    ArgumentError, Cancel, Kind, Lock, LockError, LockOptions, NodeError, NodeOutcome, Patience,
    Redlock, RetryPolicy,
};

const TTL: Duration = Duration::from_secs(10);

/// Options that wait for ever, until `cancel`.
fn forever(cancel: &Cancel) -> LockOptions {
    LockOptions::new(TTL)
        .patience(Patience::Forever)
        .cancel(cancel)
}

/// Cancels `cancel` from another thread after `after`, and returns how long
/// `wait` took from then on, and what it returned.
fn cancelled_after<T>(after: Duration, cancel: &Cancel, wait: impl FnOnce() -> T) -> (Duration, T) {
    std::thread::scope(|s| {
        let cancel = cancel.clone();
        let stopper = s.spawn(move || {
            std::thread::sleep(after);
            cancel.cancel();
            Instant::now()
        });
        let out = wait();
        let cancelled_at = stopper.join().unwrap();
        (cancelled_at.elapsed(), out)
    })
}

#[test]
fn every_form_of_resources_names_the_same_lock() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let owned = String::from("forms:a");
    let list = vec![String::from("forms:a"), String::from("forms:b")];
    let slice: &[&str] = &["forms:a", "forms:b"];
    let lock = locks.acquire(&owned, TTL).unwrap();
    assert_eq!(lock.resources(), ["forms:a"]);
    // Every form that names forms:a meets the held lock.
    for attempt in [
        locks.try_acquire("forms:a", TTL),
        locks.try_acquire(owned.clone(), TTL),
        locks.try_acquire(slice, TTL),
        locks.try_acquire(["forms:b", "forms:a"], TTL),
        locks.try_acquire(["forms:a"], TTL),
        locks.try_acquire(&list, TTL),
        locks.try_acquire(list.clone(), TTL),
    ] {
        assert!(
            matches!(attempt, Err(LockError::Contended { .. })),
            "{attempt:?}"
        );
    }
    locks.release(lock).unwrap();
    let both = locks.try_acquire(list, TTL).unwrap();
    assert_eq!(both.resources(), ["forms:a", "forms:b"]);
    locks.release(both).unwrap();
}

#[test]
fn a_fenced_lock_over_several_resources_is_refused_before_any_round() {
    let locks = Redlock::new(["redis://127.0.0.1:1"]).unwrap();
    for refused in [
        locks.try_acquire(["a", "b"], fenced(TTL)).map(drop),
        locks.try_lock(["a", "b"], fenced(TTL)).map(drop),
        Lock::from_token(
            ["a", "b"],
            redlock_sync::Token::random().unwrap(),
            Kind::Fenced,
        )
        .map(drop),
    ] {
        assert!(
            matches!(
                refused,
                Err(LockError::Argument(ArgumentError::OneResource("fenced")))
            ),
            "{refused:?}"
        );
    }
}

#[test]
fn locks_and_guards_carry_their_kind_and_a_rebuilt_fenced_lock_releases() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let lock = locks.acquire("kinds", fenced(TTL)).unwrap();
    assert_eq!(lock.kind(), Kind::Fenced);
    assert!(lock.fencing_token().is_some());
    let rebuilt = Lock::from_token("kinds", *lock.token(), Kind::Fenced).unwrap();
    locks.release(rebuilt).unwrap();
    assert!(values(&nodes, "kinds").iter().all(Option::is_none));
    let guard = locks.lock("kinds", TTL).unwrap();
    assert_eq!(guard.kind(), Kind::Plain);
    assert_eq!(guard.fencing_token(), None);
    guard.unlock().unwrap();
}

#[test]
fn a_waiter_cancelled_from_another_thread_returns_promptly_and_leaves_nothing_on_the_nodes() {
    let nodes = cluster(3);
    let holder = client(&nodes);
    let waiter = client(&nodes);
    let held = holder.acquire("cancel-me", TTL).unwrap();
    let holder_token = held.token().to_string();
    let cancel = Cancel::new();
    let (late, waited) = cancelled_after(Duration::from_millis(300), &cancel, || {
        waiter.acquire("cancel-me", forever(&cancel))
    });
    assert!(
        matches!(&waited, Err(LockError::Cancelled { resource, .. }) if resource == "cancel-me"),
        "{waited:?}"
    );
    assert!(
        late < Duration::from_secs(1),
        "returned {late:?} after the cancel"
    );
    // Only the holder's key is on the nodes: no attempt left one behind.
    wait_until(SETTLE, "only the holder's token is held", || {
        values(&nodes, "cancel-me")
            .iter()
            .all(|v| v.as_deref() == Some(holder_token.as_str()))
    });
    // A cancelled handle stays cancelled: the next call returns at once,
    // even on a free lock, without a round.
    holder.release(held).unwrap();
    let again = waiter.acquire("cancel-me", forever(&cancel));
    assert!(
        matches!(again, Err(LockError::Cancelled { .. })),
        "{again:?}"
    );
    assert!(values(&nodes, "cancel-me").iter().all(Option::is_none));
}

#[test]
fn lock_and_with_lock_stop_waiting_when_cancelled_and_the_closure_never_runs() {
    let nodes = cluster(3);
    let holder = client(&nodes);
    let waiter = client(&nodes);
    let held = holder.acquire("cancel-guard", TTL).unwrap();
    let cancel = Cancel::new();
    let (late, guard) = cancelled_after(Duration::from_millis(200), &cancel, || {
        waiter.lock("cancel-guard", forever(&cancel))
    });
    assert!(
        matches!(guard, Err(LockError::Cancelled { .. })),
        "{guard:?}"
    );
    assert!(
        late < Duration::from_secs(1),
        "returned {late:?} after the cancel"
    );

    let cancel = Cancel::new();
    let (late, ran) = cancelled_after(Duration::from_millis(200), &cancel, || {
        waiter.with_lock(
            "cancel-guard",
            forever(&cancel),
            |_| -> Result<bool, LockError> { Ok(true) },
        )
    });
    assert!(matches!(ran, Err(LockError::Cancelled { .. })), "{ran:?}");
    assert!(
        late < Duration::from_secs(1),
        "returned {late:?} after the cancel"
    );
    holder.release(held).unwrap();
}

#[test]
fn cancelling_never_touches_a_running_closure_or_its_guard() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let cancel = Cancel::new();
    let ttl = Duration::from_millis(600);
    let options = LockOptions::new(ttl).cancel(&cancel);
    let held = locks
        .with_lock("cancel-inside", options, |guard| {
            cancel.cancel();
            // The watchdog goes on extending past several TTLs.
            std::thread::sleep(ttl * 3);
            guard.check()?;
            Ok::<_, LockError>(guard.is_held())
        })
        .unwrap();
    assert!(held);
}

#[test]
fn a_cancelled_extend_leaves_the_lock_as_it_was() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let mut lock = locks.acquire("extend-cancelled", TTL).unwrap();
    let valid_until = lock.valid_until();
    let cancel = Cancel::new();
    cancel.cancel();
    let extended = locks.extend(&mut lock, LockOptions::new(TTL * 2).cancel(&cancel));
    assert!(
        matches!(extended, Err(LockError::Cancelled { .. })),
        "{extended:?}"
    );
    assert_eq!(lock.valid_until(), valid_until);
    for node in nodes.nodes() {
        let pttl = node.pttl("extend-cancelled").unwrap();
        assert!(pttl > 0 && pttl <= TTL.as_millis() as i64, "{pttl}");
    }
    locks.release(lock).unwrap();
}

#[test]
fn patience_for_a_while_gives_up_after_about_that_long() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let held = locks.acquire("patient", TTL).unwrap();
    let start = Instant::now();
    let waited = locks.acquire(
        "patient",
        LockOptions::new(TTL).patience(Patience::For(Duration::from_millis(400))),
    );
    let took = start.elapsed();
    match waited {
        // Far more attempts than the client's 3 retries of 10 to 20 ms.
        Err(LockError::Contended { attempts, .. }) => assert!(attempts > 4, "{attempts}"),
        other => panic!("expected Contended, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(2),
        "{took:?}"
    );
    let once = locks.acquire(
        "patient",
        LockOptions::new(TTL).patience(Patience::Retries(0)),
    );
    assert!(
        matches!(once, Err(LockError::Contended { attempts: 1, .. })),
        "{once:?}"
    );
    locks.release(held).unwrap();
}

#[test]
fn a_backoff_of_ones_own_plans_every_pause() {
    let nodes = cluster(3);
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let policy = RetryPolicy::default().retries(2).backoff(move |attempt| {
        counted.fetch_add(1, Ordering::Relaxed);
        Duration::from_millis(5) * attempt
    });
    let locks = common::builder(&nodes)
        .retry_policy(policy)
        .build()
        .unwrap();
    let held = locks.acquire("backoff", TTL).unwrap();
    let waited = locks.acquire("backoff", TTL);
    assert!(
        matches!(waited, Err(LockError::Contended { attempts: 3, .. })),
        "{waited:?}"
    );
    // Two retries, each after a pause the backoff planned. An attempt that
    // news (the subscription coming up) set off near a pause's end can end
    // after it, and then the rest of the wait is planned anew: a third call.
    let planned = calls.load(Ordering::Relaxed);
    assert!(
        (2..=3).contains(&planned),
        "the backoff planned {planned} pauses"
    );
    locks.release(held).unwrap();
}

/// Options that would wait for ever if nothing ended the wait.
fn endless() -> LockOptions {
    LockOptions::new(TTL).patience(Patience::Forever)
}

/// Checks that `waited` ended at once as unusable, naming the nodes that
/// failed for good: at least `nodes` of them (a round stops reading once
/// the failures decide it).
fn unusable_at_once(waited: Result<Lock, LockError>, took: Duration, nodes: usize) -> String {
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let Err(e @ LockError::Unusable { .. }) = waited else {
        panic!("expected Unusable, got {waited:?}");
    };
    let report = e.report().unwrap();
    assert!(report.unusable().count() >= nodes, "{report}");
    for node in report.unusable() {
        assert!(e.to_string().contains(&*node.node), "{e}");
    }
    e.to_string()
}

#[test]
fn a_wrong_password_ends_even_an_endless_wait_at_once() {
    let nodes = cluster(3);
    for node in nodes.nodes() {
        node.query(&["CONFIG", "SET", "requirepass", "right-Pw"])
            .unwrap();
    }
    let wrong: Vec<String> = (nodes.urls().iter())
        .map(|u| u.replace("redis://", "redis://:wrong-Pw@"))
        .collect();
    let locks = Redlock::builder(wrong)
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let start = Instant::now();
    let waited = locks.acquire("guarded", endless());
    let message = unusable_at_once(waited, start.elapsed(), 2);
    assert!(
        !message.contains("wrong-Pw"),
        "the password shows: {message}"
    );
    let start = Instant::now();
    let guard = locks.lock("guarded", endless()).map(|g| g.unlock());
    assert!(matches!(guard, Err(LockError::Unusable { .. })));
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn an_acl_user_without_the_scripts_ends_an_endless_wait_at_once() {
    let nodes = cluster(3);
    for node in nodes.nodes() {
        node.query(&[
            "ACL",
            "SETUSER",
            "no-scripts",
            "on",
            ">pw-1",
            "~*",
            "&*",
            "+@all",
            "-evalsha",
            "-eval",
        ])
        .unwrap();
    }
    let urls: Vec<String> = (nodes.urls().iter())
        .map(|u| u.replace("redis://", "redis://no-scripts:pw-1@"))
        .collect();
    let locks = common::builder_over(urls).build().unwrap();
    // Several resources take a script.
    let start = Instant::now();
    let waited = locks.acquire(["acl:a", "acl:b"], endless());
    unusable_at_once(waited, start.elapsed(), 2);
    let e = locks.try_acquire("acl:a", fenced(TTL)).unwrap_err();
    let failed = e.report().unwrap().nodes.iter().filter(|n| {
        matches!(&n.outcome, NodeOutcome::Failed(e @ NodeError::Server(reply))
            if e.is_permanent() && reply.starts_with("NOPERM"))
    });
    assert!(failed.count() >= 2, "{e}");
}

#[test]
fn a_host_that_does_not_exist_ends_an_endless_wait_at_once() {
    let locks = Redlock::builder([
        "redis://no-such-host-1.invalid:6379",
        "redis://no-such-host-2.invalid:6379",
        "redis://no-such-host-3.invalid:6379",
    ])
    .connect_timeout(Duration::from_secs(2))
    .io_timeout(Duration::from_secs(2))
    .build()
    .unwrap();
    let start = Instant::now();
    let waited = locks.acquire("nowhere", endless());
    unusable_at_once(waited, start.elapsed(), 2);
}

#[test]
fn one_unusable_node_of_three_leaves_a_quorum_and_the_lock_is_won() {
    let nodes = cluster(3);
    let mut urls = nodes.urls();
    urls[2] = "redis://no-such-host.invalid:6379".to_string();
    let locks = common::builder_over(urls).build().unwrap();
    let lock = locks.acquire("two-of-three", endless()).unwrap();
    assert!(lock.report().granted() >= 2, "{}", lock.report());
    locks.release(lock).unwrap();
}

#[test]
fn an_extend_retrying_against_unreachable_nodes_stops_when_cancelled_and_keeps_the_lock() {
    let nodes = cluster(3);
    let locks = common::builder(&nodes)
        .io_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut lock = locks.acquire("extend-retrying", TTL).unwrap();
    let valid_until = lock.valid_until();
    // Two of three nodes stop answering: every extension round lacks a
    // quorum, and an endless patience retries until cancelled.
    nodes.node(0).pause().unwrap();
    nodes.node(1).pause().unwrap();
    let cancel = Cancel::new();
    let options = LockOptions::new(TTL)
        .patience(Patience::Forever)
        .cancel(&cancel);
    let (late, extended) = cancelled_after(Duration::from_millis(500), &cancel, || {
        locks.extend(&mut lock, options)
    });
    nodes.node(0).resume().unwrap();
    nodes.node(1).resume().unwrap();
    assert!(
        matches!(extended, Err(LockError::Cancelled { .. })),
        "{extended:?}"
    );
    // At most the round under way (one io_timeout) after the cancel.
    assert!(
        late < Duration::from_secs(1),
        "returned {late:?} after the cancel"
    );
    assert_eq!(lock.valid_until(), valid_until, "the lock is as it was");
    // The paused nodes' connections are in their reconnect backoff: the
    // keys expire with the cluster.
    let _ = locks.release(lock);
}

#[test]
fn a_one_round_extend_with_three_of_five_nodes_down_returns_no_quorum_after_one_round() {
    let nodes = cluster(5);
    let io_timeout = Duration::from_millis(200);
    // Ten-second pauses between retries: a second round would show.
    let locks = common::builder(&nodes)
        .retry_policy(RetryPolicy::default().delay(Duration::from_secs(10)))
        .io_timeout(io_timeout)
        .build()
        .unwrap();
    let mut lock = locks.acquire("one-round", TTL).unwrap();
    let valid_until = lock.valid_until();
    for i in 0..3 {
        nodes.node(i).pause().unwrap();
    }
    let once = LockOptions::new(TTL).patience(Patience::Retries(0));
    let start = Instant::now();
    let extended = locks.extend(&mut lock, once);
    let took = start.elapsed();
    for i in 0..3 {
        nodes.node(i).resume().unwrap();
    }
    let Err(LockError::NoQuorum {
        attempts, report, ..
    }) = extended
    else {
        panic!("expected the quorum error, got {extended:?}");
    };
    assert_eq!(attempts, 1, "{report}");
    assert_eq!(report.failed(), 3, "{report}");
    // One round: the paused nodes' io_timeout, and a roomy margin for a
    // busy machine.
    assert!(took < io_timeout + Duration::from_secs(2), "took {took:?}");
    assert_eq!(lock.valid_until(), valid_until, "the lock is as it was");
    // The paused nodes' connections may be in their reconnect backoff: the
    // keys expire with the cluster.
    let _ = locks.release(lock);
}
