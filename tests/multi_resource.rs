//! Locks over several resources, all or nothing on each node: exclusion,
//! nothing left behind by a failed acquisition, extend and release as one,
//! and `with_lock` over several accounts moving credit between them.

mod common;

use std::time::Duration;

use common::{client, cluster, contending_client, holders, keys, values, wait_until, SETTLE};
use redlock_sync::{ArgumentError, LockError, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// `n` copies of the same list of keys, one a node.
fn on_every_node(n: usize, list: &[&str]) -> Vec<Vec<String>> {
    vec![list.iter().map(|k| k.to_string()).collect(); n]
}

#[test]
fn multi_resource_locks_sharing_a_resource_exclude_each_other_and_disjoint_ones_both_succeed() {
    let nodes = cluster(5);
    let first = client(&nodes);
    let second = client(&nodes);

    let left = first
        .acquire(["acct:1", "acct:2"], TTL)
        .expect("free resources are granted");
    assert_eq!(left.resources(), ["acct:1", "acct:2"]);
    assert_eq!(holders(&nodes, &left), 5, "every node holds both keys");

    for (what, result) in [
        (
            "a multi-resource lock sharing acct:2",
            second.try_acquire(["acct:2", "acct:3"], TTL),
        ),
        (
            "a single-resource lock on acct:1",
            second.try_acquire("acct:1", TTL),
        ),
    ] {
        match result {
            Err(LockError::Contended { report, .. }) => {
                assert!(report.refused() >= 3, "{what}: {report}")
            }
            other => panic!("{what} must be refused as contended, got {other:?}"),
        }
    }
    assert_eq!(
        values(&nodes, "acct:3"),
        vec![None; 5],
        "the refused lock left no acct:3 behind"
    );

    let right = second
        .try_acquire(["acct:3", "acct:4"], TTL)
        .expect("a disjoint multi-resource lock is granted alongside");
    assert_eq!(holders(&nodes, &right), 5);
    assert_eq!(holders(&nodes, &left), 5, "the first lock is untouched");

    first.release(left).expect("release both resources");
    let shared = second
        .try_acquire(["acct:2", "acct:1"], TTL)
        .expect("after the release the overlapping lock is granted");
    second.release(shared).unwrap();
    second.release(right).unwrap();
    assert_eq!(keys(&nodes), on_every_node(5, &[]), "nothing is left");
}

#[test]
fn a_multi_resource_acquire_that_fails_on_one_resource_leaves_none_of_the_others_on_any_node() {
    let nodes = cluster(5);
    let locks = client(&nodes);

    // One resource held on every node: every node refuses the whole set.
    let other = client(&nodes)
        .acquire("b", TTL)
        .expect("free lock is granted");
    match locks.acquire(["a", "b", "c"], TTL) {
        Err(LockError::Contended {
            resource, attempts, ..
        }) => {
            assert_eq!(resource, "a", "errors name the first resource");
            assert_eq!(attempts, 4, "retried per the policy");
        }
        other => panic!("expected the contended error, got {other:?}"),
    }
    assert_eq!(
        keys(&nodes),
        on_every_node(5, &["b"]),
        "only the other holder's key is on the nodes"
    );
    assert_eq!(holders(&nodes, &other), 5, "the other holder is untouched");

    // One resource held by a stranger on three nodes only: the two other
    // nodes grant the whole set, which is then released from them.
    for node in &nodes.nodes()[..3] {
        node.set("z", "a stranger's token").unwrap();
    }
    match locks.try_acquire(["x", "y", "z"], TTL) {
        Err(LockError::Contended { report, .. }) => {
            // Decided by the third refusal; the granting nodes may not
            // have been read by then.
            assert!(report.granted() <= 2, "{report}");
            assert_eq!(report.refused(), 3, "{report}");
        }
        other => panic!("expected the contended error, got {other:?}"),
    }
    let expected = [on_every_node(3, &["b", "z"]), on_every_node(2, &["b"])].concat();
    wait_until(
        SETTLE,
        "the nodes that granted x, y and z hold none of them any more",
        || keys(&nodes) == expected,
    );
}

#[test]
fn a_multi_resource_lock_is_extended_and_released_as_one() {
    let nodes = cluster(3);
    let locks = client(&nodes);

    let mut lock = locks.acquire(["k1", "k2", "k3"], TTL).expect("granted");
    locks
        .extend(&mut lock, 2 * TTL)
        .expect("every key is extended");
    for node in nodes.nodes() {
        for key in ["k1", "k2", "k3"] {
            let pttl = node.pttl(key).unwrap();
            assert!(
                (19_000..=20_000).contains(&pttl),
                "{key}: PTTL {pttl} ms after extending to 20 s"
            );
        }
    }

    // Another client takes k2 (as if ours had expired): extending is
    // refused as a whole, and no key gets the new TTL.
    for node in nodes.nodes() {
        node.set("k2", "someone else").unwrap();
    }
    match locks.extend(&mut lock, 6 * TTL) {
        Err(LockError::Lost { report, .. }) => assert!(report.refused() >= 2, "{report}"),
        other => panic!("expected the lost-lock error, got {other:?}"),
    }
    for node in nodes.nodes() {
        let pttl = node.pttl("k1").unwrap();
        assert!(pttl <= 20_000, "k1 was not extended: PTTL {pttl} ms");
    }

    // Release deletes what is still ours, reports the loss, and leaves the
    // other client's key.
    match locks.release(lock) {
        Err(LockError::Lost { report, .. }) => assert!(report.refused() >= 2, "{report}"),
        other => panic!("expected the lost-lock error, got {other:?}"),
    }
    let expected = on_every_node(3, &["k2"]);
    wait_until(SETTLE, "only the other client's key is left", || {
        keys(&nodes) == expected
    });
    assert_eq!(values(&nodes, "k2"), vec![Some("someone else".into()); 3]);

    // A lock over several resources is released on all of them.
    let lock = locks.acquire(["k1", "k3"], TTL).unwrap();
    let report = locks.release(lock).expect("release of a held lock");
    assert!(report.granted() >= 2, "{report}");
    wait_until(SETTLE, "both resources are released", || {
        keys(&nodes) == expected
    });
}

#[test]
fn with_lock_over_several_accounts_moves_credit_between_them_and_loses_none() {
    const ACCOUNTS: [&str; 3] = ["alice", "bob", "carol"];
    const TRANSFERS: usize = 20;
    let nodes = cluster(5);
    let locks = contending_client(&nodes);
    let bank = nodes.node(0);
    for account in ACCOUNTS {
        bank.set(&format!("balance:{account}"), "100").unwrap();
    }
    let balance = |account: &str| -> i64 {
        bank.get(&format!("balance:{account}"))
            .unwrap()
            .unwrap()
            .parse()
            .unwrap()
    };

    // Three threads move credit around the ring in both directions: each
    // transfer is a non-atomic read-modify-write of two balances, correct
    // only if no other transfer touches either account meanwhile.
    std::thread::scope(|s| {
        for t in 0..ACCOUNTS.len() {
            let (locks, balance) = (&locks, &balance);
            s.spawn(move || {
                for i in 0..TRANSFERS {
                    let (from, to) = if i % 2 == 0 {
                        (ACCOUNTS[t], ACCOUNTS[(t + 1) % 3])
                    } else {
                        (ACCOUNTS[(t + 1) % 3], ACCOUNTS[t])
                    };
                    let resources = [format!("account:{from}"), format!("account:{to}")];
                    locks
                        .with_lock(&resources, Duration::from_secs(5), |guard| {
                            let (a, b) = (balance(from), balance(to));
                            std::thread::yield_now();
                            guard.check()?;
                            bank.set(
                                &format!("balance:{from}"),
                                &(a - (i as i64 + 1)).to_string(),
                            )
                            .unwrap();
                            bank.set(&format!("balance:{to}"), &(b + (i as i64 + 1)).to_string())
                                .unwrap();
                            Ok::<_, LockError>(())
                        })
                        .expect("the transfer ran under both locks");
                }
            });
        }
    });

    let total: i64 = ACCOUNTS.iter().map(|a| balance(a)).sum();
    assert_eq!(total, 300, "credit was created or destroyed");
    // Thread t sends i+1 to its right neighbour for even i and takes i+1
    // back for odd i: +10 net for its own account, -10 for the neighbour's.
    // Every account is one thread's own and another's neighbour.
    for account in ACCOUNTS {
        assert_eq!(
            balance(account),
            100,
            "{account}: every thread's transfers cancel out"
        );
    }
    for node in nodes.nodes() {
        let locks_left: Vec<String> = node
            .keys()
            .unwrap()
            .into_iter()
            .filter(|k| k.starts_with("account:"))
            .collect();
        assert!(locks_left.is_empty(), "locks left behind: {locks_left:?}");
    }
}

#[test]
fn bad_resource_lists_are_rejected_before_any_network_traffic() {
    // Nothing listens on port 1: a rejected call never gets that far.
    let locks = Redlock::new(["redis://127.0.0.1:1"]).unwrap();
    let none: [&str; 0] = [];
    let cases: [(&[&str], ArgumentError); 3] = [
        (&none, ArgumentError::NoResources),
        (&["a", ""], ArgumentError::EmptyResource),
        (
            &["a", "b", "a"],
            ArgumentError::DuplicateResource("a".into()),
        ),
    ];
    for (resources, expected) in cases {
        for result in [
            locks.acquire(resources, TTL).map(drop),
            locks.try_acquire(resources, TTL).map(drop),
            locks.with_lock(resources, TTL, |_| -> Result<(), LockError> {
                panic!("the closure must not run for {resources:?}")
            }),
        ] {
            match result {
                Err(LockError::Argument(e)) => assert_eq!(e, expected, "{resources:?}"),
                other => panic!("{resources:?}: expected {expected}, got {other:?}"),
            }
        }
    }
}
