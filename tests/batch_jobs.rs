//! The default wait of the guard doors ([`Patience::WhileHeld`]): a batch
//! job that locks with only a TTL set runs every job once, however busy a
//! resource is; too few nodes still ends the wait after the retry policy's
//! retries, and `max_wait` still bounds it.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{builder, cluster, quick_retries};
use redlock_sync::{LockError, Patience, Redlock};

const TTL: Duration = Duration::from_secs(10);

#[test]
fn with_lock_and_only_a_ttl_runs_all_200_jobs_once_with_no_overlap() {
    let nodes = cluster(5);
    // The client's defaults, as a user builds it: 3 retries of 200-300 ms.
    let locks = Redlock::new(nodes.urls()).expect("a client");
    const RESOURCES: usize = 20;
    let inside: Vec<AtomicUsize> = (0..RESOURCES).map(|_| AtomicUsize::new(0)).collect();
    let overlaps = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let next = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let job = next.fetch_add(1, Ordering::Relaxed);
                if job >= 200 {
                    break;
                }
                // Resource 0 takes every 5th job; the others share the rest.
                let resource = match job % 5 {
                    0 => 0,
                    _ => 1 + job % (RESOURCES - 1),
                };
                let hold = Duration::from_millis(50 + (job as u64 * 37) % 151);
                let result = locks.with_lock(format!("job-{resource}"), TTL, |_guard| {
                    if inside[resource].fetch_add(1, Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(hold);
                    inside[resource].fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, LockError>(())
                });
                match result {
                    Ok(()) => drop(done.fetch_add(1, Ordering::Relaxed)),
                    Err(e) => failures.lock().unwrap().push(format!("job {job}: {e}")),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert_eq!(failures, Vec::<String>::new(), "jobs that did not run");
    assert_eq!(done.load(Ordering::Relaxed), 200);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two jobs held one lock");
}

#[test]
fn the_guard_doors_wait_past_the_retry_count_while_another_holds_the_lock() {
    let nodes = cluster(3);
    // Two retries, 10-20 ms apart: `acquire` gives up within 100 ms.
    let locks = builder(&nodes)
        .retry_policy(quick_retries(2))
        .build()
        .unwrap();
    let held = locks.acquire("busy", TTL).expect("the holder");
    assert!(matches!(
        locks.acquire("busy", TTL),
        Err(LockError::Contended { attempts: 3, .. })
    ));
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            let ran = locks.with_lock("busy", TTL, |_| Ok::<_, LockError>(()));
            (ran, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(600));
        locks.release(held).expect("the holder leaves");
        let (ran, waited) = waiter.join().unwrap();
        ran.expect("with_lock waited for the holder");
        assert!(waited >= Duration::from_millis(500), "{waited:?}");
    });
}

#[test]
fn too_few_nodes_end_a_wait_while_held_after_the_retry_count_in_a_row() {
    let nodes = cluster(3);
    let locks = builder(&nodes)
        .retry_policy(quick_retries(2))
        .build()
        .unwrap();
    nodes.node(0).kill().expect("kill");
    nodes.node(1).kill().expect("kill");
    let start = Instant::now();
    let result = locks.lock("down", TTL);
    assert!(
        matches!(result, Err(LockError::NoQuorum { .. })),
        "{result:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn max_wait_still_bounds_the_guard_doors_default_wait() {
    let nodes = cluster(3);
    let locks = builder(&nodes)
        .retry_policy(quick_retries(2))
        .max_wait(Duration::from_millis(400))
        .build()
        .unwrap();
    let held = locks.acquire("capped", TTL).expect("the holder");
    let start = Instant::now();
    let result = locks.lock("capped", TTL);
    let waited = start.elapsed();
    assert!(
        matches!(result, Err(LockError::Contended { .. })),
        "{result:?}"
    );
    assert!(waited >= Duration::from_millis(350), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    // An explicit patience replaces the default.
    let once = locks.lock(
        "capped",
        redlock_sync::LockOptions::new(TTL).patience(Patience::Retries(0)),
    );
    assert!(
        matches!(once, Err(LockError::Contended { attempts: 1, .. })),
        "{once:?}"
    );
    locks.release(held).unwrap();
}
