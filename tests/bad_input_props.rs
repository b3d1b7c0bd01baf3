//! Bad input, harder: property tests over resource names (empty, huge,
//! binary-looking, with spaces and newlines), TTLs (zero, 1 ms, around the
//! drift term, near `u64::MAX`), node URLs and token strings. Every call
//! returns `Ok` or a typed error, never panics, and a failed acquisition
//! leaves no lock key behind.
//!
//! `PROPTEST_CASES=<n>` runs more cases than the default.

mod common;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use common::cluster;
use redlock_sync::{
    ArgumentError, ConfigError, Kind, Lock, LockError, Redlock, RetryPolicy, Token, MAX_TTL,
};
use redlock_sync_testing::Cluster;

/// The prefix the crate reserves for its own keys (the fencing counters).
const RESERVED: &str = "redlock-sync:";

/// Cases per property unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 256;

fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Runs `test` over `strategy`; a failing case fails the test with the
/// smallest input proptest found.
fn check<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    if let Err(e) = runner().run(&strategy, test) {
        panic!("{e}");
    }
}

fn resource() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        Just("key with spaces\r\nand newlines\n".to_string()),
        "[ -~]{1,40}",
        "\\PC{1,30}",
        any::<String>(),
        // Binary-looking: arbitrary bytes, made valid UTF-8.
        prop::collection::vec(any::<u8>(), 1..64)
            .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        "[\\x00-\\x1f\\x7f]{1,16}",
        // Huge.
        (1usize..=64 * 1024).prop_map(|n| "r".repeat(n)),
        "[a-z]{0,8}".prop_map(|s| format!("{RESERVED}fence:{s}")),
    ]
}

fn ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_millis(1)),
        // Around the drift term (2 ms + 1 %).
        (0u64..=5_000).prop_map(Duration::from_micros),
        (1u64..=60_000).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_millis),
        (0u64..=1_000).prop_map(|d| Duration::from_millis(u64::MAX - d)),
        Just(MAX_TTL),
        Just(MAX_TTL + Duration::from_millis(1)),
        Just(Duration::MAX),
    ]
}

/// What the drift term rejects, as the client computes it (drift factor
/// 0.01 here): whole milliseconds of the TTL not above `ttl/100 + 2 ms`.
fn below_drift(ttl: Duration) -> bool {
    let whole = Duration::from_millis(ttl.as_millis() as u64);
    whole <= ttl.mul_f64(0.01) + Duration::from_millis(2)
}

/// The argument error a call must give, if any.
fn expected_argument_error(resource: &str, ttl: Duration) -> Option<ArgumentError> {
    if resource.is_empty() {
        Some(ArgumentError::EmptyResource)
    } else if resource.starts_with(RESERVED) {
        Some(ArgumentError::ReservedResource(resource.to_string()))
    } else if ttl > MAX_TTL {
        Some(ArgumentError::TtlTooLarge { ttl, max: MAX_TTL })
    } else if ttl.as_millis() == 0 {
        Some(ArgumentError::ZeroTtl)
    } else if below_drift(ttl) {
        Some(ArgumentError::TtlBelowDrift {
            ttl,
            drift: ttl.mul_f64(0.01) + Duration::from_millis(2),
        })
    } else {
        None
    }
}

/// The lock keys on every node: everything but the fencing counters, which
/// are meant to stay.
fn lock_keys(nodes: &Cluster) -> Vec<String> {
    nodes
        .nodes()
        .iter()
        .flat_map(|node| node.keys().expect("KEYS on a live node"))
        .filter(|key| !key.starts_with(RESERVED))
        .collect()
}

fn client(nodes: &Cluster) -> Redlock {
    // Room for 64 KiB names on a busy machine; no retry pauses.
    Redlock::builder(nodes.urls())
        .retry_policy(
            RetryPolicy::default()
                .retries(1)
                .delay(Duration::ZERO)
                .jitter(Duration::from_millis(1)),
        )
        .io_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

#[test]
fn acquire_with_any_resource_and_ttl_is_ok_or_a_typed_error_and_a_failure_leaves_no_key() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    check((resource(), ttl(), 0u8..4), |(resource, ttl, how)| {
        let fenced = how >= 2;
        let result = match how {
            0 => locks.acquire(&resource, ttl),
            1 => locks.try_acquire(&resource, ttl),
            2 => locks.acquire(&resource, common::fenced(ttl)),
            _ => locks.try_acquire(&resource, common::fenced(ttl)),
        };
        match (expected_argument_error(&resource, ttl), result) {
            (Some(expected), Err(LockError::Argument(got))) => {
                prop_assert_eq!(expected, got)
            }
            (Some(expected), other) => {
                prop_assert!(false, "expected {:?}, got {:?}", expected, other)
            }
            (None, Ok(lock)) => {
                prop_assert_eq!(lock.resource(), resource.as_str());
                prop_assert_eq!(lock.fencing_token().is_some(), fenced);
                prop_assert!(lock.report().granted() >= 2, "{}", lock.report());
                let report = locks.release(lock);
                prop_assert!(report.is_ok(), "release: {:?}", report);
            }
            // A plain lock named like a fencing counter contends with
            // that counter, if an earlier case made it (documented).
            (None, Err(LockError::Contended { .. })) if resource.starts_with(RESERVED) => {}
            // A TTL just above the drift term leaves too little validity.
            (None, Err(LockError::TooSlow { .. })) if ttl < Duration::from_millis(50) => {}
            (None, Err(e)) => prop_assert!(false, "expected a lock, got {}", e),
        }
        let left = lock_keys(&nodes);
        prop_assert!(left.is_empty(), "keys left behind: {:?}", left);
        Ok(())
    });
}

#[test]
fn extend_and_release_with_any_resource_token_and_ttl_are_ok_or_typed_and_create_nothing() {
    let nodes = cluster(3);
    let locks = client(&nodes);
    let token_text = prop_oneof![
        any::<String>(),
        "[0-9a-fA-F]{38,42}",
        "[0-9a-f]{40}",
        "[0-9a-f ]{40}",
    ];
    check((resource(), token_text, ttl()), |(resource, text, ttl)| {
        let parsed = text.parse::<Token>();
        let well_formed = text.len() == 40
            && text
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
        prop_assert_eq!(parsed.is_ok(), well_formed, "{:?}", parsed);
        let Ok(token) = parsed else {
            // The error converts into the typed argument error.
            let err = LockError::from(ArgumentError::from(parsed.unwrap_err()));
            prop_assert!(err.to_string().contains("40 lowercase hex"), "{}", err);
            return Ok(());
        };
        prop_assert_eq!(token.to_string(), text);
        let mut lock = match Lock::from_token(resource.clone(), token, Kind::Plain) {
            Ok(lock) => lock,
            Err(e) => {
                prop_assert!(
                    matches!(e, LockError::Argument(ArgumentError::EmptyResource)),
                    "{}",
                    e
                );
                prop_assert!(resource.is_empty());
                return Ok(());
            }
        };
        // Nobody holds it: extend and release find nothing to touch.
        match locks.extend(&mut lock, ttl) {
            Err(LockError::Lost { .. }) | Err(LockError::Argument(_)) => {}
            other => prop_assert!(
                false,
                "extend: expected Lost or an argument error, got {:?}",
                other
            ),
        }
        match locks.release(lock) {
            Err(LockError::Lost { .. }) => {}
            other => prop_assert!(false, "release: expected Lost, got {:?}", other),
        }
        let left = lock_keys(&nodes);
        prop_assert!(left.is_empty(), "keys created: {:?}", left);
        Ok(())
    });
}

/// A password that appears nowhere else in a generated URL.
const SECRET: &str = "Pa55w0rdXyZ";

fn url() -> impl Strategy<Value = String> {
    let scheme = prop_oneof![
        Just("redis"),
        Just("rediss"),
        Just("redis+unix"),
        Just("valkey"),
        Just("valkeys"),
        Just("valkey+unix"),
        Just("unix"),
        Just("http"),
        Just("REDIS"),
        Just(""),
    ];
    let user = prop_oneof![Just(String::new()), "[a-z]{1,6}"];
    // Passwords with characters that mean something in a URL.
    let password = prop_oneof![
        Just(String::new()),
        "[/?#:@%a-z]{0,4}".prop_map(|s| format!("{SECRET}{s}")),
    ];
    let host = prop_oneof![
        Just("127.0.0.1".to_string()),
        Just("localhost".to_string()),
        Just("[::1]".to_string()),
        Just(String::new()),
        "[a-z0-9.-]{1,20}",
    ];
    let port = prop_oneof![
        Just(String::new()),
        any::<u16>().prop_map(|p| format!(":{p}")),
        any::<u64>().prop_map(|p| format!(":{p}")),
        Just(":-1".to_string()),
        Just(":port".to_string()),
    ];
    let tail = prop_oneof![
        Just(String::new()),
        any::<u32>().prop_map(|db| format!("/{db}")),
        "/[a-z0-9?=&]{0,10}",
    ];
    prop_oneof![
        (scheme, user, password, host, port, tail).prop_map(
            |(scheme, user, password, host, port, tail)| {
                let auth = if user.is_empty() && password.is_empty() {
                    String::new()
                } else {
                    format!("{user}:{password}@")
                };
                format!("{scheme}://{auth}{host}{port}{tail}")
            }
        ),
        "/[a-z/]{0,20}(\\?db=[0-9a-z]{0,3})?".prop_map(|path| format!("redis+unix://{path}")),
        "/[a-z/]{1,20}".prop_map(|path| format!("valkey+unix://{path}?db=1&pass={SECRET}")),
        any::<String>(),
        "[ -~]{0,40}",
    ]
}

#[test]
fn building_a_client_from_any_node_url_is_ok_or_a_config_error_and_neither_shows_the_password() {
    check(prop::collection::vec(url(), 0..4), |urls| {
        let builder = format!("{:?}", Redlock::builder(&urls));
        prop_assert!(
            !builder.contains(SECRET),
            "the builder's Debug shows the password: {}",
            builder
        );
        // Build only: no connection is opened, so nothing reaches any host.
        match Redlock::new(&urls) {
            Ok(locks) => {
                let shown = format!("{locks:?}");
                prop_assert!(
                    !shown.contains(SECRET),
                    "Debug shows the password: {}",
                    shown
                );
                prop_assert!(!urls.is_empty());
                prop_assert_eq!(locks.nodes().len(), urls.len());
                for name in locks.nodes() {
                    prop_assert!(
                        !name.contains(SECRET),
                        "node name shows the password: {}",
                        name
                    );
                }
            }
            Err(LockError::Config(e)) => {
                if urls.is_empty() {
                    prop_assert_eq!(&e, &ConfigError::NoNodes);
                }
                let message = e.to_string();
                prop_assert!(
                    !message.contains(SECRET),
                    "the error shows the password: {}",
                    message
                );
            }
            Err(other) => prop_assert!(false, "expected a config error, got {}", other),
        }
        Ok(())
    });
}
