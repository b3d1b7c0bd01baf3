//! Waiters wake when the lock is released, instead of sleeping out their
//! retry pause. The waiting clients here pause for seconds between
//! attempts, so an acquisition that follows a release within a fraction of
//! that pause was woken by it; each bound is generous, far below the pause.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{cluster, holders, listeners, wait_until, wait_until_held_by};
use redlock_sync::{Lock, Redlock, RedlockBuilder, RetryPolicy};
use redlock_sync_testing::{Cluster, Fault, Proxy};

const TTL: Duration = Duration::from_secs(10);
/// The waiters' retry pause: without a wake-up, no retry comes sooner.
const PAUSE: Duration = Duration::from_secs(4);
/// How soon after a release a woken waiter must hold the lock: far below
/// [`PAUSE`], and roomy for a busy 2-core machine.
const WOKEN_WITHIN: Duration = Duration::from_millis(1500);
/// How long a test waits for a waiter to be listening.
const LISTENING_WITHIN: Duration = Duration::from_secs(5);

/// A client that pauses [`PAUSE`] between attempts.
fn patient(urls: Vec<String>) -> RedlockBuilder {
    Redlock::builder(urls)
        .retry_policy(
            RetryPolicy::default()
                .retries(20)
                .delay(PAUSE)
                .jitter(Duration::ZERO),
        )
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
}

/// Waits until some node among `among` has a listener for `resource`.
fn wait_for_listener(cluster: &Cluster, among: &[usize], resource: &str) {
    wait_until(
        LISTENING_WITHIN,
        &format!("a waiter listens for releases of {resource}"),
        || among.iter().any(|&i| listeners(cluster, i, resource) > 0),
    );
}

/// Starts `locks.acquire(resource)` on a thread; it returns the lock and
/// when it was acquired.
fn waiter(locks: &Redlock, resource: &str) -> thread::JoinHandle<(Lock, Instant)> {
    let locks = locks.clone();
    let resource = resource.to_string();
    thread::spawn(move || {
        let lock = locks
            .acquire(&resource, TTL)
            .expect("acquired once released");
        (lock, Instant::now())
    })
}

/// Releases `held` through `holder` once a waiter listens, and checks that
/// the waiter then holds the lock within [`WOKEN_WITHIN`].
fn release_and_expect_woken(
    nodes: &Cluster,
    among: &[usize],
    holder: &Redlock,
    held: Lock,
    waiting: thread::JoinHandle<(Lock, Instant)>,
) -> Lock {
    let resource = held.resource().to_string();
    wait_for_listener(nodes, among, &resource);
    let released = Instant::now();
    holder.release(held).expect("release");
    let (lock, acquired) = waiting.join().expect("waiter thread");
    assert!(acquired >= released, "acquired before the release");
    let took = acquired - released;
    assert!(
        took < WOKEN_WITHIN,
        "the waiter took {took:?} after the release: it slept its {PAUSE:?} pause"
    );
    lock
}

#[test]
fn a_waiter_acquires_soon_after_another_clients_release_not_after_its_pause() {
    let nodes = cluster(3);
    let holder = Redlock::new(nodes.urls()).unwrap();
    let locks = patient(nodes.urls()).build().unwrap();
    let held = holder.acquire("report", TTL).unwrap();
    let waiting = waiter(&locks, "report");
    let lock = release_and_expect_woken(&nodes, &[0, 1, 2], &holder, held, waiting);
    wait_until_held_by(&nodes, &lock, 3);
    locks.release(lock).unwrap();
}

#[test]
fn a_release_through_the_same_client_wakes_its_own_waiter() {
    let nodes = cluster(3);
    let locks = patient(nodes.urls()).build().unwrap();
    let held = locks.acquire("shared", TTL).unwrap();
    let waiting = waiter(&locks, "shared");
    let lock = release_and_expect_woken(&nodes, &[0, 1, 2], &locks, held, waiting);
    locks.release(lock).unwrap();
}

#[test]
fn a_multi_resource_waiter_wakes_when_one_of_its_resources_is_released() {
    let nodes = cluster(3);
    let holder = Redlock::new(nodes.urls()).unwrap();
    let locks = patient(nodes.urls()).build().unwrap();
    let held = holder.acquire("shelf:4", TTL).unwrap();
    let waiting = {
        let locks = locks.clone();
        thread::spawn(move || {
            let lock = locks.acquire(["shelf:3", "shelf:4"], TTL).unwrap();
            (lock, Instant::now())
        })
    };
    let lock = release_and_expect_woken(&nodes, &[0, 1, 2], &holder, held, waiting);
    assert_eq!(lock.resources(), ["shelf:3", "shelf:4"]);
    locks.release(lock).unwrap();
}

#[test]
fn a_waiter_still_acquires_after_the_holder_dies_without_releasing() {
    let nodes = cluster(3);
    let crashed = Redlock::new(nodes.urls()).unwrap();
    let ttl = Duration::from_millis(400);
    let abandoned = crashed.acquire("orphan", ttl).unwrap();
    let expires = abandoned.valid_until();
    // The holder goes away without a release: nothing is published.
    drop(abandoned);
    drop(crashed);
    let locks = Redlock::builder(nodes.urls())
        .retry_policy(
            RetryPolicy::default()
                .retries(100)
                .delay(Duration::from_millis(50))
                .jitter(Duration::from_millis(20)),
        )
        .build()
        .unwrap();
    let lock = locks
        .acquire("orphan", TTL)
        .expect("acquired once it expired");
    assert!(Instant::now() >= expires, "acquired before the key expired");
    assert!(holders(&nodes, &lock) >= 2, "a quorum holds the token");
    locks.release(lock).unwrap();
}

#[test]
fn a_node_that_is_down_does_not_stop_wake_ups_from_the_others() {
    let nodes = cluster(5);
    // The first node, where a client listens first, is down.
    nodes.node(0).kill().unwrap();
    let holder = Redlock::new(nodes.urls()).unwrap();
    let locks = patient(nodes.urls()).build().unwrap();
    let held = holder.acquire("down", TTL).unwrap();
    let waiting = waiter(&locks, "down");
    let lock = release_and_expect_woken(&nodes, &[1, 2, 3, 4], &holder, held, waiting);
    locks.release(lock).unwrap();
}

#[test]
fn a_partitioned_node_does_not_stop_wake_ups_from_the_others() {
    let nodes = cluster(5);
    let proxies = nodes.proxies().expect("a proxy per node");
    let holder = Redlock::new(nodes.urls()).unwrap();
    let locks = patient(proxies.iter().map(Proxy::url).collect())
        .build()
        .unwrap();
    // A first wait leaves the waiter's client listening on the first node.
    let held = holder.acquire("cut", TTL).unwrap();
    let waiting = waiter(&locks, "cut");
    let lock = release_and_expect_woken(&nodes, &[0], &holder, held, waiting);
    locks.release(lock).unwrap();

    // Now that node is cut off, its connections open but silent.
    proxies[0].set_fault(Fault::Partition);
    let held = holder.acquire("cut", TTL).unwrap();
    let waiting = waiter(&locks, "cut");
    let lock = release_and_expect_woken(&nodes, &[1, 2, 3, 4], &holder, held, waiting);
    proxies[0].set_fault(Fault::None);
    locks.release(lock).unwrap();
}

#[test]
fn many_waiters_one_release_at_a_time_exactly_one_holds() {
    let nodes = cluster(5);
    // Three clients, three threads each, with the default pause: hand-offs
    // come from wake-ups.
    let clients: Vec<Redlock> = (0..3)
        .map(|_| {
            Redlock::builder(nodes.urls())
                .retry_policy(RetryPolicy::default().retries(1_000))
                .io_timeout(Duration::from_millis(500))
                .connect_timeout(Duration::from_millis(500))
                .build()
                .unwrap()
        })
        .collect();
    let holding = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let rounds = 6;
    thread::scope(|s| {
        for locks in &clients {
            for _ in 0..3 {
                let (holding, done, nodes) = (&holding, &done, &nodes);
                s.spawn(move || {
                    for _ in 0..rounds {
                        let lock = locks.acquire("hot", TTL).expect("acquired in turn");
                        let before = holding.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(before, 0, "two holders at once");
                        assert!(holders(nodes, &lock) >= 3, "held by a quorum");
                        thread::sleep(Duration::from_millis(2));
                        holding.fetch_sub(1, Ordering::SeqCst);
                        locks.release(lock).expect("release");
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        }
    });
    assert_eq!(done.load(Ordering::SeqCst), 9 * rounds);
}

#[test]
fn a_retry_delay_and_wait_budget_past_the_clocks_range_wait_for_a_release_without_panicking() {
    let nodes = cluster(3);
    let holder = patient(nodes.urls()).build().unwrap();
    let held = holder.acquire("unbounded", TTL).unwrap();
    let waiter = patient(nodes.urls())
        .retry_policy(RetryPolicy::default().retries(1).delay(Duration::MAX))
        .max_wait(Duration::MAX)
        .build()
        .unwrap();
    let (done, outcome) = std::sync::mpsc::channel();
    let waiting = waiter.clone();
    thread::spawn(move || {
        let _ = done.send(waiting.acquire("unbounded", TTL));
    });
    // Only a release can end the waiter's pause: the waiter looks once
    // more when it starts listening, so releasing at any moment is caught.
    thread::sleep(Duration::from_millis(50));
    holder.release(held).unwrap();
    let lock = outcome
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiter was woken by the release")
        .expect("and then acquired");
    waiter.release(lock).unwrap();
}
