//! `rediss://` nodes (feature `tls`) against real TLS-only redis-server
//! processes, with a throwaway certificate authority made by `openssl`
//! (the harness's [`Cluster::start_tls`]).
//!
//! Run with `cargo test --features tls --test tls`.
//! Without the feature this test binary is empty.

#![cfg(feature = "tls")]

use std::time::{Duration, Instant};

use redlock_sync::{LockError, LockOptions, Patience, Redlock};
use redlock_sync_testing::Cluster;

#[test]
fn locks_work_over_rediss_and_valkeys_with_a_verified_certificate() {
    let cluster = Cluster::start_tls(3)
        .unwrap_or_else(|e| panic!("could not start 3 TLS redis-server nodes: {e}"));
    // Before the client trusts the cluster's CA, every node fails TLS: an
    // error waiting cannot fix, which ends even an endless wait at once.
    let untrusting = Redlock::builder(cluster.urls())
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let start = Instant::now();
    let endless = LockOptions::new(Duration::from_secs(10)).patience(Patience::Forever);
    match untrusting.acquire("over-tls", endless) {
        Err(e @ LockError::Unusable { .. }) => {
            assert!(e.report().unwrap().unusable().count() >= 2, "{e}")
        }
        other => panic!("expected Unusable, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(8));
    // The client trusts the cluster's CA through rustls' usual environment
    // variable. This test binary has this one test, so no other thread
    // reads it.
    std::env::set_var("SSL_CERT_FILE", cluster.ca_file().unwrap());
    let urls = cluster.urls();
    let locks = Redlock::builder(&urls)
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("rediss:// URLs are accepted with the tls feature");

    let lock = locks
        .acquire("over-tls", Duration::from_secs(10))
        .expect("acquire over TLS");
    assert!(lock.report().granted() >= 2, "{}", lock.report());
    assert!(
        matches!(
            locks.try_acquire("over-tls", Duration::from_secs(10)),
            Err(LockError::Contended { .. })
        ),
        "a held lock is refused over TLS too"
    );
    locks.release(lock).expect("release over TLS");

    // valkeys:// is the same as rediss://.
    let valkeys: Vec<String> = urls
        .iter()
        .map(|u| u.replace("rediss://", "valkeys://"))
        .collect();
    let over_valkeys = Redlock::builder(&valkeys)
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("valkeys:// URLs are accepted with the tls feature");
    let lock = over_valkeys
        .try_acquire("over-tls", Duration::from_secs(10))
        .expect("acquire over valkeys://");
    over_valkeys.release(lock).expect("release over valkeys://");

    // A plain-TCP client cannot talk to these nodes: TLS is really in use.
    let plain: Vec<String> = urls
        .iter()
        .map(|u| u.replace("rediss://", "redis://"))
        .collect();
    let plain = Redlock::builder(&plain)
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(plain
        .try_acquire("over-tls", Duration::from_secs(10))
        .is_err());
}
