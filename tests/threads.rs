//! Many threads sharing one client contend for one resource.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{cluster, contending_client};
use redlock_sync::{LockError, Redlock, RetryPolicy};
use redlock_sync_testing::{Fault, Proxy};

const THREADS: usize = 8;
const SECTIONS: usize = 100;

#[test]
fn redlock_is_send_sync_and_clone() {
    fn assert_shareable<T: Send + Sync + Clone + 'static>() {}
    assert_shareable::<Redlock>();
}

#[test]
fn eight_threads_doing_read_modify_write_under_the_lock_lose_no_update() {
    let nodes = cluster(5);
    let locks = contending_client(&nodes);
    let counter = nodes.node(0);
    counter.set("counter", "0").unwrap();
    let acquisitions = AtomicU64::new(0);

    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..SECTIONS {
                    let lock = locks
                        .acquire("counter-lock", Duration::from_secs(5))
                        .expect("acquire eventually succeeds");
                    acquisitions.fetch_add(1, Ordering::Relaxed);
                    // A non-atomic read-modify-write: without mutual
                    // exclusion, concurrent sections would lose updates.
                    let value: u64 = counter.get("counter").unwrap().unwrap().parse().unwrap();
                    std::thread::yield_now();
                    counter.set("counter", &(value + 1).to_string()).unwrap();
                    assert!(lock.is_valid(), "the section ended within the validity");
                    locks.release(lock).expect("release of a held lock");
                }
            });
        }
    });

    let count: u64 = counter.get("counter").unwrap().unwrap().parse().unwrap();
    let acquired = acquisitions.load(Ordering::Relaxed);
    assert_eq!(acquired, (THREADS * SECTIONS) as u64);
    assert_eq!(
        count, acquired,
        "every successful acquisition incremented the counter exactly once"
    );
}

/// A command that finds another thread blocked reading its node's
/// connection is written at once, not after that read returns: behind
/// nodes whose round trip is over half the io_timeout, threads sharing one
/// client lose no round that a lone thread would win.
#[test]
fn threads_sharing_a_client_do_not_wait_behind_each_others_reads() {
    let nodes = cluster(5);
    let proxies = nodes.proxies().expect("a proxy per node");
    for proxy in &proxies {
        proxy.set_fault(Fault::Delay(Duration::from_millis(60)));
    }
    let locks = Redlock::builder(proxies.iter().map(Proxy::url))
        .retry_policy(RetryPolicy::default().retries(0))
        .io_timeout(Duration::from_millis(216))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    // Connect to every node before the threads start. A fresh connection
    // costs a handshake round trip on top of the command's, which a loaded
    // machine can push past the 216 ms io_timeout: what this test proves
    // starts once the connections are up, so warm up until a round won.
    let warm = (0..20).any(|attempt| {
        locks
            .try_acquire(format!("warm-up:{attempt}"), Duration::from_secs(10))
            .map(|lock| locks.release(lock))
            .is_ok()
    });
    assert!(warm, "no warm-up round won in 20 attempts");
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..8 {
            let (locks, failures) = (&locks, &failures);
            s.spawn(move || {
                for i in 0..10 {
                    match locks.try_acquire(format!("hol:{t}:{i}"), Duration::from_secs(10)) {
                        Ok(lock) => {
                            let _ = locks.release(lock);
                        }
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of 80 uncontended acquisitions failed, the first: {}",
        failures.len(),
        failures[0]
    );
}

/// Thirty-two threads share one client's connections, half of them asking
/// for a resource held elsewhere (the nodes answer nil) and half for
/// resources of their own (the nodes answer OK), in batches that mix both:
/// a reply handed to the wrong thread would grant a held resource or refuse
/// a free one.
#[test]
fn thirty_two_threads_sharing_connections_each_get_their_own_replies() {
    let nodes = cluster(5);
    let holder = common::builder(&nodes).build().unwrap();
    let held = holder
        .acquire("held", Duration::from_secs(60))
        .expect("the holder takes the resource first");
    let locks = common::builder(&nodes)
        .retry_policy(RetryPolicy::default().retries(0))
        .build()
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..32 {
            let locks = &locks;
            s.spawn(move || {
                for i in 0..30 {
                    if t % 2 == 0 {
                        match locks.try_acquire("held", Duration::from_secs(10)) {
                            Err(LockError::Contended { .. }) => {}
                            other => panic!("thread {t}, try {i}: a held resource gave {other:?}"),
                        }
                    } else {
                        let lock = locks
                            .try_acquire(format!("own:{t}:{i}"), Duration::from_secs(10))
                            .unwrap_or_else(|e| {
                                panic!("thread {t}, try {i}: a free resource gave {e}")
                            });
                        locks.release(lock).expect("release of a held lock");
                    }
                }
            });
        }
    });
    holder.release(held).expect("the holder still held it");
}
