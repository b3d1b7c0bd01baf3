//! Every bad input gets a typed error that names the problem, never a panic.

mod common;

use std::time::Duration;

use common::cluster;
use redlock_sync::{
    ArgumentError, ConfigError, Kind, Lock, LockError, Redlock, RetryPolicy, Token, MAX_TTL,
};

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

#[test]
fn a_bad_url_names_the_url_without_its_password_and_the_part_that_is_wrong() {
    for (url, part) in [
        ("redis://:hunter2@127.0.0.1:99999", "port `99999`"),
        ("redis://:hunter2@127.0.0.1:notaport", "port `notaport`"),
        ("redis://:hunter2@127.0.0.1:0", "port `0`"),
        ("redis://:hunter2@:6379", "host is missing"),
        (
            "redis://:hunter2@127.0.0.1:6379/notadb",
            "database `notadb`",
        ),
        ("redis://:hunter2@127.0.0.1:6379/-1", "database number -1"),
        ("redis://:hunt/er2@127.0.0.1:6379", "percent-encode"),
        ("redis://:hunt#er2@127.0.0.1:6379", "percent-encode"),
        ("redis://::1:6379", "IPv6 address goes in brackets"),
        ("redis://:hunter2127.0.0.1:6379", "a password before an '@'"),
        ("redis://[::g]:6379", "not an IPv6 address"),
        ("redis://[::1]x:6379", "expected :port"),
        ("redis://my host:6379", "no host name may hold"),
        ("valkey://:hunter2@127.0.0.1:70000", "port `70000`"),
        ("redis+unix://relative.sock", "socket path"),
        ("redis+unix:///tmp/n.sock?db=x&pass=hunter2", "database `x`"),
    ] {
        let built = Redlock::new([url]);
        assert!(built.is_err(), "{url:?} is refused");
        match config_error(built) {
            ConfigError::NodeUrl { url: shown, reason } => {
                assert!(
                    reason.contains(part),
                    "{url:?}: the reason names the part ({part}): {reason}"
                );
                let message = LockError::from(ConfigError::NodeUrl {
                    url: shown.clone(),
                    reason: reason.clone(),
                })
                .to_string();
                assert!(
                    !message.contains("hunter2"),
                    "the password shows: {message}"
                );
                assert!(
                    !message.contains("did not parse"),
                    "{url:?}: the redis crate's message is replaced: {message}"
                );
                assert!(
                    shown.starts_with(url.split("://").next().unwrap()),
                    "the URL is named: {shown}"
                );
            }
            other => panic!("{url:?}: expected NodeUrl, got {other}"),
        }
    }
}

#[test]
fn valkey_urls_are_accepted_like_their_redis_forms() {
    let locks = Redlock::new([
        "valkey://127.0.0.1:7001",
        "valkey://:pw@127.0.0.1:7002/3",
        "valkey+unix:///tmp/redlock-valkey.sock?db=2",
    ])
    .expect("valkey URLs are accepted");
    assert_eq!(
        locks.nodes(),
        [
            "127.0.0.1:7001",
            "127.0.0.1:7002",
            "/tmp/redlock-valkey.sock"
        ]
    );
    // One server under both schemes is still one server.
    match config_error(Redlock::new([
        "redis://127.0.0.1:7001",
        "valkey://127.0.0.1:7001",
    ])) {
        ConfigError::DuplicateNode { node } => assert_eq!(node, "127.0.0.1:7001"),
        other => panic!("expected DuplicateNode, got {other}"),
    }
}

#[cfg(not(feature = "tls"))]
#[test]
fn rediss_and_valkeys_without_the_tls_feature_say_which_feature_to_enable() {
    for url in ["rediss://127.0.0.1:6380", "valkeys://127.0.0.1:6380"] {
        match config_error(Redlock::new([url])) {
            ConfigError::NodeUrl { reason, .. } => {
                assert!(reason.contains("`tls` feature"), "{url}: {reason}")
            }
            other => panic!("{url}: expected NodeUrl, got {other}"),
        }
    }
}

#[cfg(feature = "tls")]
#[test]
fn valkeys_urls_are_tls_nodes_with_the_tls_feature() {
    let locks = Redlock::new(["valkeys://127.0.0.1:6380", "rediss://127.0.0.1:6381"])
        .expect("valkeys URLs are accepted with the tls feature");
    assert_eq!(locks.nodes(), ["tls 127.0.0.1:6380", "tls 127.0.0.1:6381"]);
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
        argument_error(Lock::from_token("", Token::random().unwrap(), Kind::Plain)),
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
    let mut lock = Lock::from_token("r", Token::random().unwrap(), Kind::Plain).unwrap();
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
        .retry_policy(
            RetryPolicy::default()
                .retries(5)
                .delay(Duration::ZERO)
                .jitter(Duration::ZERO),
        )
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
