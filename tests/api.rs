//! The public API's hygiene, as a user meets it: the common traits, `Send`
//! and `Sync`, `Debug` that never shows a password, and errors that say
//! everything in their message without repeating a cause.

use std::error::Error;
use std::time::Duration;

use redlock_sync::{
    ArgumentError, ConfigError, Lock, LockError, LockGuard, NodeError, NodeOutcome, NodeReport,
    ParseTokenError, Redlock, RedlockBuilder, Report, Token,
};

fn send_sync<T: Send + Sync + 'static>() {}

#[test]
fn every_public_type_is_send_and_sync_so_it_can_cross_threads() {
    send_sync::<Redlock>();
    send_sync::<RedlockBuilder>();
    send_sync::<Lock>();
    send_sync::<LockGuard>();
    send_sync::<Token>();
    send_sync::<Report>();
    send_sync::<NodeReport>();
    send_sync::<NodeOutcome>();
    send_sync::<NodeError>();
    send_sync::<LockError>();
    send_sync::<ConfigError>();
    send_sync::<ArgumentError>();
    send_sync::<ParseTokenError>();
}

#[test]
fn a_struct_holding_a_client_can_derive_debug() {
    #[derive(Debug)]
    struct App {
        locks: Redlock,
    }
    let app = App {
        locks: Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]).unwrap(),
    };
    assert_eq!(app.locks.quorum(), 2);
    let shown = format!("{app:?}");
    assert!(shown.contains("127.0.0.1:7001"), "{shown}");
    assert!(shown.contains("quorum: 2"), "{shown}");
    assert!(shown.contains("retries: 3"), "{shown}");
    // An observer, a closure, shows as one word.
    let observed = Redlock::builder(["redis://127.0.0.1:7001"]).observer(|_| {});
    let shown = format!("{observed:?}");
    assert!(shown.contains("observer: Some(Observer)"), "{shown}");
}

#[test]
fn debug_of_the_client_and_the_builder_hides_every_password() {
    let urls = [
        "redis://:hunter2@127.0.0.1:7001/1",
        "redis://alice:hunter2@127.0.0.1:7002",
        "redis+unix:///tmp/redlock-api-test.sock?db=1&pass=hunter2",
    ];
    let builder = Redlock::builder(urls).io_timeout(Duration::from_millis(75));
    let shown = format!("{builder:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        shown.contains("redis://alice:***@127.0.0.1:7002"),
        "{shown}"
    );
    assert!(shown.contains("pass=***"), "{shown}");
    assert!(shown.contains("io_timeout: 75ms"), "{shown}");

    let locks = builder.build().unwrap();
    let shown = format!("{locks:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("\"127.0.0.1:7001\""), "{shown}");
    assert!(shown.contains("\"/tmp/redlock-api-test.sock\""), "{shown}");
    assert!(shown.contains("io_timeout: 75ms"), "{shown}");
    let pretty = format!("{locks:#?}");
    assert!(!pretty.contains("hunter2"), "{pretty}");
}

#[test]
fn errors_say_everything_in_their_message_and_repeat_no_cause_as_source() {
    let errors = [
        LockError::from(ConfigError::NoNodes),
        LockError::from(ArgumentError::EmptyResource),
        LockError::from("nope".parse::<Token>().unwrap_err()),
        Redlock::new(["redis://127.0.0.1:99999"]).unwrap_err(),
        LockError::Random(std::io::Error::from_raw_os_error(38)),
        LockError::Thread(std::io::Error::other("no threads left")),
    ];
    for error in &errors {
        assert!(
            error.source().is_none(),
            "{error}: the cause is in the message, so not also a source"
        );
    }
    assert_eq!(
        errors[0].to_string(),
        format!("invalid configuration: {}", ConfigError::NoNodes)
    );
    assert!(errors[2].to_string().contains("40 lowercase hex"));
    assert!(errors[3].to_string().contains("99999"));
    assert!(errors[5].to_string().contains("no threads left"));
}

#[test]
fn tokens_order_and_hash_so_they_can_key_maps_and_sets() {
    let a: Token = "0000000000000000000000000000000000000001".parse().unwrap();
    let b: Token = "0000000000000000000000000000000000000002".parse().unwrap();
    assert!(a < b);
    let set: std::collections::BTreeSet<Token> = [b, a, b].into_iter().collect();
    assert_eq!(set.into_iter().collect::<Vec<_>>(), [a, b]);
    let hashed: std::collections::HashSet<Token> = [a, b, a].into_iter().collect();
    assert_eq!(hashed.len(), 2);
}
