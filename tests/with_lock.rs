//! `with_lock` against real redis-server nodes: the watchdog keeps the lock
//! alive, reports a loss at once, honours the hold cap, stops when the
//! closure ends; the release always runs; and the wait budget of `acquire`.

mod common;

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    builder, client, cluster, fenced, holds_throughout, slow_retrying_client, values, wait_until,
};
use redlock_sync::{LockError, LockOptions, Redlock, RetryPolicy};

#[test]
fn a_closure_running_three_ttls_keeps_exclusive_ownership_and_the_lock_is_gone_right_after() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let rival = client(&nodes);
    let ttl = Duration::from_millis(450);

    let (rival_attempts, extensions) = locks
        .with_lock("long-job", ttl, |guard| {
            let start = Instant::now();
            let (mut attempts, mut extensions) = (0, 0);
            let mut last_validity = guard.validity();
            while start.elapsed() < 3 * ttl {
                match rival.try_acquire("long-job", ttl) {
                    Err(LockError::Contended { .. }) => attempts += 1,
                    other => panic!(
                        "the rival must be refused while the closure runs, got {other:?} after {:?}",
                        start.elapsed()
                    ),
                }
                if let Err(e) = guard.check() {
                    panic!(
                        "the lock must stay held, lost after {:?}: {e}",
                        start.elapsed()
                    );
                }
                let validity = guard.validity();
                if validity > last_validity {
                    extensions += 1;
                }
                last_validity = validity;
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok::<_, LockError>((attempts, extensions))
        })
        .expect("a lock held throughout is reported as held");
    assert_eq!(
        values(&nodes, "long-job"),
        vec![None; 5],
        "the release ran before with_lock returned"
    );
    assert!(
        rival_attempts >= 20,
        "the rival tried {rival_attempts} times, expected at least 20"
    );
    assert!(
        extensions >= 3,
        "expected at least 3 extensions over 3 TTLs, saw {extensions}"
    );

    // No extension lands after the release: the key stays gone for longer
    // than an extension interval.
    holds_throughout(ttl, "`long-job` absent on every node", || {
        values(&nodes, "long-job") == vec![None; 5]
    });
    let lock = rival
        .try_acquire("long-job", ttl)
        .expect("the rival wins right after the release");
    rival.release(lock).unwrap();
}

#[test]
fn with_lock_returns_as_soon_as_the_closure_ends_even_with_a_long_ttl() {
    let nodes = cluster(3);
    let locks = client(&nodes);

    let start = Instant::now();
    let value = locks
        .with_lock("quick", Duration::from_secs(30), |guard| {
            assert!(guard.is_held(), "held when the closure starts");
            assert!(guard.validity() > Duration::from_secs(29));
            assert_eq!(guard.resource(), "quick");
            assert_eq!(guard.resources(), ["quick"]);
            assert_eq!(
                values(&nodes, "quick"),
                vec![Some(guard.token().to_string()); 3],
                "every node holds the guard's token"
            );
            Ok::<_, LockError>(42)
        })
        .expect("granted and held");
    let took = start.elapsed();
    assert_eq!(value, 42, "the closure's value comes back");
    // A watchdog that slept until its first extension was due would hold
    // with_lock up for some 20 s.
    assert!(
        took < Duration::from_millis(500),
        "with_lock took {took:?}: the watchdog must not hold it up"
    );
    assert_eq!(values(&nodes, "quick"), vec![None; 3]);
}

#[test]
fn killing_three_of_five_nodes_turns_is_held_false_within_one_ttl_and_with_lock_reports_lost() {
    let nodes = cluster(5);
    let locks = client(&nodes);
    let ttl = Duration::from_millis(450);

    let mut lost_after = None;
    let result = locks.with_lock("fragile", ttl, |guard| {
        // Wait for one extension, so that the kill comes mid-life.
        let first_end = Instant::now() + guard.validity();
        wait_until(2 * ttl, "the watchdog extended the lock", || {
            Instant::now() + guard.validity() > first_end + ttl / 2
        });
        for i in 0..3 {
            nodes.node(i).kill().unwrap();
        }
        let killed = Instant::now();
        assert!(
            guard.is_held(),
            "right after the kill the validity is not over yet"
        );
        wait_until(2 * ttl, "is_held() turned false", || !guard.is_held());
        lost_after = Some(killed.elapsed());
        assert!(
            matches!(guard.check(), Err(LockError::Lost { .. })),
            "check() gives the lost-lock error"
        );
        assert!(guard.is_ending() && guard.validity().is_zero());
        assert!(!guard.is_held(), "a lost lock stays lost");
        Ok::<_, LockError>("done")
    });

    let lost_after = lost_after.expect("the closure ran");
    // The watchdog's extension after the kill fails (no quorum), its retries
    // fail, and the validity runs out: at most one TTL after the kill, which
    // is one extension interval (2/3 TTL) plus the third of the TTL left.
    let bound = ttl + Duration::from_millis(150);
    assert!(
        lost_after <= bound,
        "is_held() turned false {lost_after:?} after the kill, expected within {bound:?}"
    );
    match result {
        Err(LockError::Lost {
            resource, report, ..
        }) => {
            assert_eq!(resource, "fragile");
            assert!(report.failed() >= 3, "the dead nodes failed: {report}");
        }
        other => {
            panic!("expected the lost-lock error although the closure returned Ok, got {other:?}")
        }
    }
}

#[test]
fn a_panic_in_the_closure_releases_the_lock_and_propagates() {
    let nodes = cluster(3);
    let locks = client(&nodes);

    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        locks.with_lock(
            "panicky",
            Duration::from_secs(10),
            |_guard| -> Result<(), LockError> { panic!("boom inside the critical section") },
        )
    }));
    let payload = outcome.expect_err("the panic propagates out of with_lock");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"boom inside the critical section"),
        "the closure's own panic payload comes out"
    );
    assert_eq!(
        values(&nodes, "panicky"),
        vec![None; 3],
        "the lock was released before the panic resumed"
    );
    let lock = locks
        .try_acquire("panicky", Duration::from_secs(10))
        .expect("free right after");
    locks.release(lock).unwrap();
}

#[derive(Debug)]
enum JobError {
    Lock(LockError),
    Invalid(&'static str),
}

impl From<LockError> for JobError {
    fn from(e: LockError) -> JobError {
        JobError::Lock(e)
    }
}

#[test]
fn the_closures_own_error_comes_back_and_the_lock_is_released() {
    let nodes = cluster(3);
    let locks = client(&nodes);

    let result: Result<(), JobError> =
        locks.with_lock("failing", Duration::from_secs(10), |guard| {
            guard.check()?;
            Err(JobError::Invalid("row 7 is malformed"))
        });
    match result {
        Err(JobError::Invalid(why)) => assert_eq!(why, "row 7 is malformed"),
        Err(JobError::Lock(e)) => panic!("expected the closure's error, got the lock error {e}"),
        Ok(()) => panic!("expected the closure's error, got Ok"),
    }
    assert_eq!(values(&nodes, "failing"), vec![None; 3]);
}

#[test]
fn the_hold_cap_ends_extensions_and_with_lock_then_reports_the_lost_lock() {
    let nodes = cluster(5);
    let ttl = Duration::from_millis(300);
    let max_hold = Duration::from_millis(800);
    let locks = builder(&nodes).max_hold(max_hold).build().unwrap();

    let mut seen = None;
    let start = Instant::now();
    let result = locks.with_lock("capped", ttl, |guard| {
        let entered = Instant::now();
        let hold_deadline = guard.hold_deadline().expect("a cap is set");
        let (mut ending_at, mut furthest) = (None, Instant::now());
        wait_until(3 * max_hold, "the capped lock ran out", || {
            if ending_at.is_none() && guard.is_ending() {
                ending_at = Some(Instant::now());
            }
            // A lost lock has zero validity: only a positive one names a
            // deadline.
            let (now, validity) = (Instant::now(), guard.validity());
            if !validity.is_zero() {
                furthest = furthest.max(now + validity);
            }
            !guard.is_held()
        });
        seen = Some((entered, hold_deadline, ending_at, furthest, Instant::now()));
        Ok::<_, LockError>(())
    });

    let (entered, hold_deadline, ending_at, furthest, lost_at) = seen.expect("the closure ran");
    // The acquisition lies between the call and the closure's start.
    assert!(
        hold_deadline >= start + max_hold && hold_deadline <= entered + max_hold,
        "the cap counts from the acquisition: it ends {:?} after with_lock began, {:?} after the closure began",
        hold_deadline - start,
        hold_deadline.saturating_duration_since(entered)
    );
    let ending_at = ending_at.expect("is_ending() turned true before the lock ran out");
    assert!(
        ending_at + Duration::from_millis(50) < lost_at,
        "is_ending() warned {:?} before the end, expected more",
        lost_at - ending_at
    );
    // The validity never reached past the cap, and the last extension was
    // shortened to end there rather than skipped.
    assert!(
        furthest <= hold_deadline,
        "the validity reached {:?} past the cap",
        furthest - hold_deadline
    );
    assert!(
        furthest + Duration::from_millis(100) >= hold_deadline,
        "the validity ended {:?} before the cap, expected at the cap",
        hold_deadline - furthest
    );
    assert!(
        lost_at >= furthest,
        "is_held() was false only once the validity ran out"
    );
    assert!(
        matches!(result, Err(LockError::Lost { .. })),
        "the closure outlived the lock: expected the lost-lock error, got {result:?}"
    );
    wait_until(Duration::from_secs(1), "the capped keys are gone", || {
        values(&nodes, "capped") == vec![None; 5]
    });
}

#[test]
fn extend_when_left_sets_how_early_the_watchdog_extends() {
    let nodes = cluster(3);
    let ttl = Duration::from_millis(1000);
    let locks = builder(&nodes).extend_when_left(0.9).build().unwrap();

    let lowest = locks
        .with_lock("eager", ttl, |guard| {
            let start = Instant::now();
            let mut lowest = guard.validity();
            while start.elapsed() < Duration::from_millis(600) {
                lowest = lowest.min(guard.validity());
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok::<_, LockError>(lowest)
        })
        .expect("held throughout");
    // Extended each time 90% of the validity is left: it stays near 900 ms
    // (without extensions it would sink to 400 ms within the 600 ms; with
    // the default of 1/3 it would not be extended yet).
    assert!(
        lowest >= Duration::from_millis(700),
        "lowest validity {lowest:?}, expected about 880 ms"
    );
}

#[test]
fn acquire_and_with_lock_give_up_within_the_wait_budget() {
    let nodes = cluster(3);
    let holder = client(&nodes);
    let held = holder
        .acquire("busy", Duration::from_secs(10))
        .expect("free lock");
    let budget = Duration::from_millis(300);
    let locks = builder(&nodes)
        .retry_policy(
            RetryPolicy::default()
                .retries(u32::MAX)
                .delay(Duration::from_millis(10))
                .jitter(Duration::from_millis(10)),
        )
        .max_wait(budget)
        .build()
        .unwrap();

    let start = Instant::now();
    let err = locks
        .acquire("busy", Duration::from_secs(10))
        .expect_err("the lock stays held");
    let took = start.elapsed();
    match err {
        LockError::Contended { attempts, .. } => {
            assert!(attempts > 5, "kept trying: {attempts} attempts")
        }
        other => panic!("expected the contended error, got {other}"),
    }
    // The last attempt starts before the budget is spent, never after it,
    // and no pause is slept past it.
    assert!(
        took >= budget - Duration::from_millis(50) && took <= budget + Duration::from_millis(150),
        "acquire gave up after {took:?} with a budget of {budget:?}"
    );

    let ran = AtomicBool::new(false);
    let start = Instant::now();
    let result = locks.with_lock("busy", Duration::from_secs(10), |_| {
        ran.store(true, Ordering::Relaxed);
        Ok::<_, LockError>(())
    });
    let took = start.elapsed();
    assert!(
        matches!(result, Err(LockError::Contended { .. })),
        "{result:?}"
    );
    assert!(!ran.load(Ordering::Relaxed), "the closure must not run");
    assert!(
        took <= budget + Duration::from_millis(150),
        "with_lock gave up after {took:?} with a budget of {budget:?}"
    );
    holder.release(held).unwrap();
}

#[test]
fn acquire_with_a_wait_budget_wins_once_an_abandoned_lock_expires() {
    let nodes = cluster(3);
    let crashed = client(&nodes);
    let ttl = Duration::from_millis(300);
    // A holder that never releases: the lock is free only once it expires.
    let abandoned = crashed.acquire("handover", ttl).expect("free lock");
    let expires = abandoned.valid_until();
    let locks: Redlock = builder(&nodes)
        .retry_policy(
            RetryPolicy::default()
                .retries(u32::MAX)
                .delay(Duration::from_millis(10))
                .jitter(Duration::from_millis(10)),
        )
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap();

    let lock = locks
        .acquire("handover", Duration::from_secs(10))
        .expect("acquired within the budget once the abandoned lock expired");
    let acquired = Instant::now();
    assert!(
        acquired >= expires,
        "acquired {:?} before the abandoned lock's validity ran out",
        expires - acquired
    );
    assert!(
        acquired <= expires + Duration::from_millis(200),
        "acquired {:?} after the abandoned lock expired, expected sooner",
        acquired - expires
    );
    locks.release(lock).unwrap();
}

#[test]
fn a_hold_cap_shorter_than_the_ttl_means_is_ending_from_the_start() {
    let nodes = cluster(3);
    let locks = builder(&nodes)
        .max_hold(Duration::from_millis(200))
        .build()
        .unwrap();
    locks
        .with_lock("short-cap", Duration::from_secs(10), |guard| {
            // The acquisition's validity already reaches past the cap: no
            // extension will come, and the guard says so at once.
            assert!(guard.is_ending(), "no extension can come, yet not ending");
            assert!(guard.is_held());
            Ok::<_, LockError>(())
        })
        .unwrap();
}

#[test]
fn try_with_lock_takes_one_round_and_does_not_run_the_closure_when_the_lock_is_held() {
    let nodes = cluster(3);
    let holder = client(&nodes);
    let patient = slow_retrying_client(&nodes);
    let ran = AtomicBool::new(false);

    let held = holder.acquire("one-shot", Duration::from_secs(10)).unwrap();
    let result = patient.try_with_lock("one-shot", Duration::from_secs(10), |_| {
        ran.store(true, Ordering::SeqCst);
        Ok::<_, LockError>(())
    });
    match result {
        Err(LockError::Contended { attempts, .. }) => assert_eq!(attempts, 1),
        other => panic!("expected the contended error, got {other:?}"),
    }
    let result = patient.try_with_lock(["spare", "one-shot"], Duration::from_secs(10), |_| {
        ran.store(true, Ordering::SeqCst);
        Ok::<_, LockError>(())
    });
    match result {
        Err(LockError::Contended { attempts, .. }) => assert_eq!(attempts, 1),
        other => panic!("expected the contended error, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the closure never ran");
    assert_eq!(values(&nodes, "spare"), vec![None; 3], "all or nothing");
    holder.release(held).unwrap();

    let value = patient
        .try_with_lock("one-shot", Duration::from_secs(10), |guard| {
            guard.check()?;
            Ok::<_, LockError>(7)
        })
        .expect("free now");
    assert_eq!(value, 7);
    assert_eq!(values(&nodes, "one-shot"), vec![None; 3]);
}

#[test]
fn with_lock_fenced_gives_a_growing_fencing_token_that_extensions_keep() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let ttl = Duration::from_millis(300);

    let mut tokens = Vec::new();
    for round in 0..3 {
        let token = locks
            .with_lock("fenced-job", fenced(ttl), |guard| {
                let token = guard.fencing_token().expect("a fenced guard has a token");
                if round == 1 {
                    // Run past an extension: the token stays.
                    let valid_until = Instant::now() + guard.validity();
                    wait_until(3 * ttl, "the watchdog extended the lock", || {
                        Instant::now() + guard.validity() > valid_until + ttl / 3
                    });
                    guard.check()?;
                    assert_eq!(guard.fencing_token(), Some(token));
                }
                Ok::<_, LockError>(token)
            })
            .expect("granted and held");
        tokens.push(token);
    }
    let last = locks
        .try_with_lock("fenced-job", fenced(ttl), |guard| {
            Ok::<_, LockError>(guard.fencing_token())
        })
        .expect("granted")
        .expect("a fenced guard has a token");
    tokens.push(last);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens grow: {tokens:?}"
    );
    // A plain with_lock has none.
    let plain = locks
        .with_lock("plain-job", ttl, |guard| {
            Ok::<_, LockError>(guard.fencing_token())
        })
        .unwrap();
    assert_eq!(plain, None);
}

#[test]
fn a_loop_reuses_its_options_by_reference_with_an_owner_label_from_format() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let options = LockOptions::new(Duration::from_secs(10)).owner(format!("worker:{}", 7));
    let mut ran = 0;
    for job in 0..3 {
        let resource = format!("job:{job}");
        // The error type comes from the match below: no `Ok::<_, LockError>`.
        let result = locks.with_lock(&resource, &options, |guard| {
            guard.check()?;
            let view = locks.inspect(&resource)?;
            Ok(format!("{:?}", view.nodes))
        });
        match result {
            Ok(nodes) => {
                assert!(nodes.contains("\"worker:7\""), "{nodes}");
                ran += 1;
            }
            Err(LockError::Contended { .. }) => panic!("job {job}: the lock is free"),
            Err(e) => panic!("job {job}: {e}"),
        }
    }
    assert_eq!(ran, 3);
    // The options were only borrowed: they are here, unchanged.
    let lock = locks.acquire("job:0", &options).unwrap();
    let view = locks.inspect("job:0").unwrap();
    assert!(
        format!("{:?}", view.nodes).contains("\"worker:7\""),
        "the label went with the borrowed options: {view:?}"
    );
    locks.release(lock).unwrap();
}
