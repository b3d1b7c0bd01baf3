//! Every bad input gets a typed error that names the problem, never a panic.

mod common;

use std::time::Duration;

use common::cluster;
use redlock_sync::{ArgumentError, ConfigError, Lock, LockError, Redlock, Token, MAX_TTL};

/// A client over a port nothing listens on: argument checks come before any
/// network traffic, so these tests need no server.
fn offline() -> Redlock {
    Redlock::new(["redis://127.0.0.1:1"]).unwrap()
}

fn config_error(result: Result<Redlock, LockError>) -> ConfigError {
    match result {
        Err(LockError::Config(e)) => e,
        Err(other) => panic!("expected a configuration error, got {other}"),
        Ok(_) => panic!("expected a configuration error, got a client"),
    }
}

fn argument_error<T: std::fmt::Debug>(result: Result<T, LockError>) -> ArgumentError {
    match result {
        Err(LockError::Argument(e)) => e,
        other => panic!("expected an argument error, got {other:?}"),
    }
}

#[test]
fn no_nodes_is_rejected() {
    let none: [&str; 0] = [];
    assert_eq!(config_error(Redlock::new(none)), ConfigError::NoNodes);
}

#[test]
fn unparsable_and_unsupported_urls_are_rejected_without_showing_the_password() {
    for url in [
        "",
        "not a url",
        "http://127.0.0.1:6379",
        "redis://",
        "redis://:hunter2@127.0.0.1:notaport",
        "redis://127.0.0.1:6379/notadb",
    ] {
        match config_error(Redlock::new([url])) {
            ConfigError::NodeUrl { url: shown, reason } => {
                assert!(!reason.is_empty(), "{url:?}: a reason is given");
                assert!(
                    !shown.contains("hunter2"),
                    "the password is hidden: {shown}"
                );
            }
            other => panic!("{url:?}: expected NodeUrl, got {other}"),
        }
    }
}

#[cfg(not(feature = "tls"))]
#[test]
fn rediss_without_the_tls_feature_says_which_feature_to_enable() {
    match config_error(Redlock::new(["rediss://127.0.0.1:6380"])) {
        ConfigError::NodeUrl { reason, .. } => assert!(reason.contains("tls"), "{reason}"),
        other => panic!("expected NodeUrl, got {other}"),
    }
}

#[test]
fn the_same_server_listed_twice_is_rejected() {
    for pair in [
        ["redis://127.0.0.1:7001", "redis://127.0.0.1:7001"],
        ["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001/1"],
        ["redis://:a@127.0.0.1:7001", "redis://:b@127.0.0.1:7001/3"],
        ["redis+unix:///tmp/n.sock", "redis+unix:///tmp/n.sock?db=1"],
    ] {
        match config_error(Redlock::new(pair)) {
            ConfigError::DuplicateNode { node } => {
                assert!(!node.contains(":a@") && !node.contains(":b@"), "{node}")
            }
            other => panic!("{pair:?}: expected DuplicateNode, got {other}"),
        }
    }
}

#[test]
fn a_drift_factor_outside_zero_to_one_is_rejected() {
    for factor in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        let result = Redlock::builder(["redis://127.0.0.1:7001"])
            .drift_factor(factor)
            .build();
        assert!(
            matches!(config_error(result), ConfigError::DriftFactor { .. }),
            "drift factor {factor}"
        );
    }
    for factor in [0.0, 0.5, 0.999] {
        Redlock::builder(["redis://127.0.0.1:7001"])
            .drift_factor(factor)
            .build()
            .unwrap_or_else(|e| panic!("drift factor {factor} is valid: {e}"));
    }
}

#[test]
fn zero_timeouts_are_rejected() {
    let io = Redlock::builder(["redis://127.0.0.1:7001"])
        .io_timeout(Duration::ZERO)
        .build();
    assert_eq!(
        config_error(io),
        ConfigError::ZeroTimeout {
            which: "io_timeout"
        }
    );
    for which in ["io_timeout", "connect_timeout"] {
        let builder = Redlock::builder(["redis://127.0.0.1:7001"]);
        let builder = match which {
            "io_timeout" => builder.io_timeout(Duration::MAX),
            _ => builder.connect_timeout(Duration::MAX),
        };
        assert_eq!(
            config_error(builder.build()),
            ConfigError::TimeoutTooLarge {
                which,
                max: redlock_sync::MAX_TIMEOUT
            },
            "a timeout that no Instant can hold is refused, not a panic later"
        );
    }
    let connect = Redlock::builder(["redis://127.0.0.1:7001"])
        .connect_timeout(Duration::ZERO)
        .build();
    assert_eq!(
        config_error(connect),
        ConfigError::ZeroTimeout {
            which: "connect_timeout"
        }
    );
}

#[test]
fn an_empty_resource_is_rejected() {
    let locks = offline();
    let ttl = Duration::from_secs(1);
    assert_eq!(
        argument_error(locks.acquire("", ttl)),
        ArgumentError::EmptyResource
    );
    assert_eq!(
        argument_error(locks.try_acquire("", ttl)),
        ArgumentError::EmptyResource
    );
    assert_eq!(
        argument_error(Lock::from_token("", Token::random().unwrap())),
        ArgumentError::EmptyResource
    );
}

#[test]
fn ttls_that_are_zero_below_the_drift_term_or_too_large_are_rejected() {
    let locks = offline();
    assert_eq!(
        argument_error(locks.try_acquire("r", Duration::ZERO)),
        ArgumentError::ZeroTtl
    );
    assert_eq!(
        argument_error(locks.try_acquire("r", Duration::from_micros(900))),
        ArgumentError::ZeroTtl
    );
    for ttl in [Duration::from_millis(1), Duration::from_millis(2)] {
        assert!(matches!(
            argument_error(locks.try_acquire("r", ttl)),
            ArgumentError::TtlBelowDrift { .. }
        ));
    }
    for ttl in [MAX_TTL + Duration::from_millis(1), Duration::MAX] {
        assert!(matches!(
            argument_error(locks.try_acquire("r", ttl)),
            ArgumentError::TtlTooLarge { .. }
        ));
    }
    let mut lock = Lock::from_token("r", Token::random().unwrap()).unwrap();
    assert_eq!(
        argument_error(locks.extend(&mut lock, Duration::ZERO)),
        ArgumentError::ZeroTtl
    );
}

#[test]
fn token_strings_that_are_not_40_lowercase_hex_characters_are_rejected() {
    for bad in [
        "",
        "abc",
        "0123456789ABCDEF0123456789abcdef01234567",
        "0123456789abcdef0123456789abcdef0123456",
        "0123456789abcdef0123456789abcdef012345678",
        "0123456789abcdef0123456789abcdef0123456z",
        " 123456789abcdef0123456789abcdef01234567",
    ] {
        let err = bad.parse::<Token>().expect_err(bad);
        let as_lock_error = LockError::from(ArgumentError::from(err.clone()));
        assert!(
            as_lock_error.to_string().contains("40 lowercase hex"),
            "{as_lock_error}"
        );
    }
}

#[test]
fn zero_retry_delay_and_zero_jitter_retry_without_panicking() {
    let nodes = cluster(3);
    let locks = Redlock::builder(nodes.urls())
        .retry_count(5)
        .retry_delay(Duration::ZERO)
        .retry_jitter(Duration::ZERO)
        .build()
        .unwrap();
    let held = locks.acquire("busy", Duration::from_secs(10)).unwrap();
    match locks.acquire("busy", Duration::from_secs(10)) {
        Err(LockError::Contended { attempts, .. }) => assert_eq!(attempts, 6),
        other => panic!("expected the contended error, got {other:?}"),
    }
    locks.release(held).unwrap();
}

#[test]
fn an_extend_when_left_outside_zero_to_one_is_rejected() {
    for fraction in [0.0, -0.5, 1.0, 2.0, f64::NAN, f64::INFINITY] {
        let result = Redlock::builder(["redis://127.0.0.1:7001"])
            .extend_when_left(fraction)
            .build();
        assert!(
            matches!(config_error(result), ConfigError::ExtendWhenLeft { .. }),
            "extend_when_left {fraction}"
        );
    }
    for fraction in [0.01, 1.0 / 3.0, 0.99] {
        Redlock::builder(["redis://127.0.0.1:7001"])
            .extend_when_left(fraction)
            .build()
            .unwrap_or_else(|e| panic!("extend_when_left {fraction} is valid: {e}"));
    }
}
