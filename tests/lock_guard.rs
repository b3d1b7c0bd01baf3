//! `Redlock::lock` against real redis-server nodes: the guard keeps the lock
//! alive past its TTL, releases it when dropped (at the end of a scope, on
//! an early return, while a panic unwinds), and `unlock` says how it went.

mod common;

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use common::{
    client, cluster, fenced, holds_throughout, slow_retrying_client, values, wait_until, SETTLE,
};
use redlock_sync::{ArgumentError, LockError, RetryPolicy};

#[test]
fn a_guard_keeps_the_lock_alive_past_three_ttls_and_dropping_it_releases_and_stops_the_watchdog() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let rival = client(&nodes);
    // Long enough that a round slowed by a loaded machine still extends it.
    let ttl = Duration::from_secs(1);

    let guard = locks.lock("guarded", ttl).expect("granted");
    holds_throughout(
        3 * ttl + ttl / 2,
        "the lock held, and refused to a rival",
        || {
            guard.check().is_ok()
                && matches!(
                    rival.try_acquire("guarded", ttl),
                    Err(LockError::Contended { .. })
                )
        },
    );
    assert!(guard.validity() > Duration::ZERO);
    drop(guard);
    assert_eq!(
        values(&nodes, "guarded"),
        vec![None; 5],
        "released by the time drop returned"
    );
    // No extension lands after the release: the watchdog was stopped.
    holds_throughout(ttl, "`guarded` absent on every node", || {
        values(&nodes, "guarded") == vec![None; 5]
    });
}

#[test]
fn a_guard_is_released_on_an_early_return() {
    let nodes = cluster(3);
    let locks = client(&nodes);

    let work = || -> Result<(), LockError> {
        let guard = locks.lock(["early:a", "early:b"], Duration::from_secs(10))?;
        assert!(guard.is_held());
        assert_eq!(guard.resources(), ["early:a", "early:b"]);
        // Any error from here on returns early, dropping the guard.
        Err(ArgumentError::EmptyResource)?;
        guard.unlock().map(drop)
    };
    assert!(matches!(work(), Err(LockError::Argument(_))));
    assert_eq!(values(&nodes, "early:a"), vec![None; 3]);
    assert_eq!(values(&nodes, "early:b"), vec![None; 3]);
}

#[test]
fn a_guard_is_released_while_a_panic_unwinds() {
    let nodes = cluster(3);
    let locks = client(&nodes);

    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let _guard = locks.lock("unwinding", Duration::from_secs(10)).unwrap();
        panic!("boom while holding the guard");
    }));
    assert!(outcome.is_err(), "the panic came through");
    assert_eq!(
        values(&nodes, "unwinding"),
        vec![None; 3],
        "released as the panic unwound"
    );
    let lock = locks
        .try_acquire("unwinding", Duration::from_secs(10))
        .expect("free right after");
    locks.release(lock).unwrap();
}

#[test]
fn unlock_releases_and_returns_the_release_report() {
    let nodes = cluster(3);
    let locks = client(&nodes);

    let guard = locks.lock("unlocked", Duration::from_secs(10)).unwrap();
    let token = Some(guard.token().to_string());
    wait_until(SETTLE, "every node holds the guard's token", || {
        values(&nodes, "unlocked") == vec![token.clone(); 3]
    });
    let report = guard.unlock().expect("released");
    assert!(report.granted() >= locks.quorum(), "{report}");
    assert_eq!(report.nodes.len(), 3);
    assert_eq!(values(&nodes, "unlocked"), vec![None; 3]);
}

#[test]
fn unlock_after_the_lock_was_taken_reports_it_lost_and_leaves_the_new_holders_keys() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let rival = client(&nodes);
    // Long enough that a round slowed by a loaded machine still extends it.
    let ttl = Duration::from_secs(1);

    let guard = locks.lock("taken", ttl).unwrap();
    // The keys vanish (as if they had expired), and a rival takes the lock.
    for node in nodes.nodes() {
        node.query(&["DEL", "taken"]).unwrap();
    }
    let rivals = rival.acquire("taken", Duration::from_secs(10)).unwrap();
    wait_until(2 * ttl, "the guard saw the lock lost", || !guard.is_held());
    assert!(matches!(guard.check(), Err(LockError::Lost { .. })));
    assert!(guard.is_ending());
    match guard.unlock() {
        Err(LockError::Lost {
            resource, report, ..
        }) => {
            assert_eq!(resource, "taken");
            assert!(report.refused() >= 2, "the extension was refused: {report}");
        }
        other => panic!("expected the lost-lock error, got {other:?}"),
    }
    assert_eq!(
        values(&nodes, "taken"),
        vec![Some(rivals.token().to_string()); 3],
        "the rival's keys are untouched"
    );
    rival.release(rivals).unwrap();
}

#[test]
fn try_lock_takes_one_round_and_fails_at_once_when_the_lock_is_held() {
    let nodes = cluster(3);
    let holder = client(&nodes);
    let patient = slow_retrying_client(&nodes);

    let held = holder.acquire("busy", Duration::from_secs(10)).unwrap();
    match patient.try_lock("busy", Duration::from_secs(10)) {
        Err(LockError::Contended { attempts, .. }) => assert_eq!(attempts, 1),
        other => panic!("expected the contended error, got {other:?}"),
    }
    match patient.try_lock(["free", "busy"], Duration::from_secs(10)) {
        Err(LockError::Contended { attempts, .. }) => assert_eq!(attempts, 1),
        other => panic!("expected the contended error, got {other:?}"),
    }
    assert_eq!(values(&nodes, "free"), vec![None; 3], "all or nothing");
    holder.release(held).unwrap();

    let guard = patient
        .try_lock("busy", Duration::from_secs(10))
        .expect("free now");
    assert_eq!(
        guard.fencing_token(),
        None,
        "a plain lock has no fencing token"
    );
    guard.unlock().unwrap();
}

#[test]
fn a_fenced_guard_keeps_its_growing_fencing_token_across_extensions() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    // Long enough that a round slowed by a loaded machine still extends it.
    let ttl = Duration::from_secs(1);

    let first = locks.lock("fenced-guard", fenced(ttl)).unwrap();
    let token = first.fencing_token().expect("a fenced guard has a token");
    let valid_until = Instant::now() + first.validity();
    wait_until(3 * ttl, "the watchdog extended the lock", || {
        Instant::now() + first.validity() > valid_until + ttl / 3
    });
    assert!(first.is_held());
    assert_eq!(
        first.fencing_token(),
        Some(token),
        "unchanged by extensions"
    );
    first.unlock().unwrap();

    let second = locks.try_lock("fenced-guard", fenced(ttl)).unwrap();
    let next = second.fencing_token().expect("a fenced guard has a token");
    assert!(next > token, "{next} after {token}: tokens grow");
    second.unlock().unwrap();
}

#[test]
fn a_guard_shows_its_lock_in_debug_with_the_token_redacted() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let guard = locks.lock("shown", Duration::from_secs(10)).unwrap();
    let shown = format!("{guard:?}");
    let token = guard.token().to_string();
    assert!(shown.contains("\"shown\""), "{shown}");
    assert!(
        shown.contains(&format!("Token({}…)", &token[..8])),
        "{shown}"
    );
    assert!(!shown.contains(&token[8..]), "{shown}");
    let lock = locks
        .try_acquire("shown-too", Duration::from_secs(10))
        .unwrap();
    let token = lock.token().to_string();
    let shown = format!("{lock:?}");
    assert!(!shown.contains(&token[8..]), "{shown}");
    locks.release(lock).unwrap();
}

#[test]
fn a_failed_extension_is_retried_within_the_validity_left_however_long_the_retry_delay() {
    let nodes = cluster(3);
    let (failed, told) = std::sync::mpsc::channel();
    let failed = std::sync::Mutex::new(failed);
    // Ten-second pauses between retries, against a 3 s TTL: a retry planned
    // by the policy alone would come after the lock ran out.
    let locks = common::builder(&nodes)
        .retry_policy(
            RetryPolicy::default()
                .retries(100)
                .delay(Duration::from_secs(10)),
        )
        .observer(move |event| {
            if matches!(event.what, redlock_sync::What::ExtendFailed) {
                let _ = failed.lock().unwrap().send(());
            }
        })
        .build()
        .unwrap();
    let guard = locks.lock("retried", Duration::from_secs(3)).unwrap();
    // A majority stops answering: the first extension fails.
    nodes.node(1).pause().unwrap();
    nodes.node(2).pause().unwrap();
    let first_failure = told.recv_timeout(Duration::from_secs(10));
    nodes.node(1).resume().unwrap();
    nodes.node(2).resume().unwrap();
    first_failure.expect("the watchdog's first extension failed");
    // The retry comes while validity is left, and keeps the lock: held
    // well past the TTL that the acquisition gave it.
    let start = Instant::now();
    holds_throughout(Duration::from_secs(4), "the guard holds the lock", || {
        guard.is_held()
    });
    assert!(start.elapsed() >= Duration::from_secs(4));
    guard.unlock().expect("held throughout");
}
