//! Many threads sharing one client contend for one resource.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{cluster, patient_client};
use redlock_sync::Redlock;

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
    let locks = patient_client(&nodes);
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
