//! The restarted-node guard: a node whose uptime is below the configured
//! grace period does not vote.
//!
//! A node that restarts without persistence has forgotten every lock it
//! held. If it voted at once, a second client could win a quorum that
//! includes it while the first client still holds the lock on the others.
//! Keeping it out of every round until it has been up for longer than the
//! longest TTL in use lets every lock it forgot expire first.
//!
//! The uptime is read with `INFO server`, pipelined with the connection's
//! handshake, so the guard costs no extra round trip. It is read on every
//! new connection, and every new server process is reached through a new
//! connection (a connection to a process that died fails, and a failed
//! connection is never reused), so no command of a round ever reaches a
//! server process that has been up for less than the grace period.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::Value;

use super::servers::info_fields;
use crate::error::NodeError;

/// What the guard saw of one node's restarts: the server process (its
/// `run_id`) the node last reached, and until when a restart seen keeps the
/// node out, by this client's monotonic clock.
#[derive(Default)]
pub(crate) struct Seen(Mutex<(Option<String>, Option<Instant>)>);

/// Checks an `INFO server` reply against the grace period: `Ok` if the node
/// has certainly been up for at least `grace`, by its own word and by what
/// this client saw of it (`seen`).
///
/// `uptime_in_seconds` is the difference of two whole-second readings of
/// the node's clock (now, and when it started), so a node that reports `u`
/// seconds has been up for more than `u - 1` seconds and possibly not much
/// more: that lower bound is what is compared with the grace, which errs on
/// the side of refusing.
///
/// The node's clock may be stepped after it started (time sync after a boot
/// with a wrong clock), and then its uptime jumps. So once this client sees
/// a restart (a `run_id` other than the one it reached before, or a new one
/// with an uptime below the grace), it keeps the node out for the whole
/// grace from then on its own clock, whatever uptime the node reports later.
///
/// A reply without a readable uptime is refused too: with the guard on, a
/// node that cannot show how long it has been up does not vote.
pub(crate) fn check(info: &Value, grace: Duration, seen: &Seen) -> Result<(), NodeError> {
    let info = info_fields(info);
    let Some(uptime) = info.get("uptime_in_seconds").map(Duration::from_secs) else {
        return Err(NodeError::Protocol(
            "INFO server has no readable uptime_in_seconds; the restart guard cannot tell how long the node has been up"
                .to_string(),
        ));
    };
    let now = Instant::now();
    let young = uptime.saturating_sub(Duration::from_secs(1)) < grace;
    let mut seen = seen.0.lock().unwrap_or_else(PoisonError::into_inner);
    let run_id = info.get("run_id");
    if run_id != seen.0 {
        if young || seen.0.is_some() {
            seen.1 = Some(now + grace);
        }
        seen.0 = run_id;
    }
    let left = seen
        .1
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
    if young || !left.is_zero() {
        let uptime = if young { uptime } else { grace - left };
        return Err(NodeError::Restarted { uptime, grace });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(uptime: &str) -> Value {
        Value::BulkString(
            format!("# Server\r\nredis_version:7.0.15\r\nuptime_in_seconds:{uptime}\r\nuptime_in_days:0\r\n")
                .into_bytes(),
        )
    }

    #[test]
    fn a_node_certainly_up_for_at_least_the_grace_votes() {
        assert_eq!(
            check(&info("61"), Duration::from_secs(60), &Seen::default()),
            Ok(())
        );
        assert_eq!(
            check(&info("3600"), Duration::from_secs(60), &Seen::default()),
            Ok(())
        );
        assert_eq!(check(&info("0"), Duration::ZERO, &Seen::default()), Ok(()));
    }

    #[test]
    fn a_node_maybe_up_for_less_than_the_grace_is_refused() {
        // 60 read means anywhere above 59 s: maybe less than 60 s.
        assert_eq!(
            check(&info("60"), Duration::from_secs(60), &Seen::default()),
            Err(NodeError::Restarted {
                uptime: Duration::from_secs(60),
                grace: Duration::from_secs(60)
            })
        );
        // 2 read means anywhere above 1 s: not surely 1.5 s.
        assert!(check(&info("2"), Duration::from_millis(1500), &Seen::default()).is_err());
        assert!(check(&info("3"), Duration::from_millis(1500), &Seen::default()).is_ok());
        assert!(check(&info("0"), Duration::from_millis(1), &Seen::default()).is_err());
    }

    #[test]
    fn an_info_reply_without_a_readable_uptime_is_refused() {
        for reply in [
            Value::Nil,
            Value::Int(5),
            Value::BulkString(b"# Server\r\nredis_version:7.0.15\r\n".to_vec()),
            info("-3"),
            info("soon"),
            Value::BulkString(vec![0xff, 0xfe]),
        ] {
            assert!(
                matches!(
                    check(&reply, Duration::from_secs(1), &Seen::default()),
                    Err(NodeError::Protocol(_))
                ),
                "{reply:?} was not refused as unreadable"
            );
        }
    }

    #[test]
    fn a_node_seen_restarting_stays_out_for_the_grace_on_this_clock_whatever_uptime_it_reports_later(
    ) {
        let at = |run_id: &str, uptime: u64| {
            Value::BulkString(
                format!("run_id:{run_id}\r\nuptime_in_seconds:{uptime}\r\n").into_bytes(),
            )
        };
        let grace = Duration::from_millis(300);
        // Seen young, then its clock steps a minute forward.
        let seen = Seen::default();
        assert!(check(&at("a", 0), grace, &seen).is_err());
        assert!(check(&at("a", 60), grace, &seen).is_err());
        // A server this client reached before, then another one (a restart),
        // old by its word: kept out too.
        let other = Seen::default();
        assert_eq!(check(&at("b", 60), grace, &other), Ok(()));
        assert!(check(&at("c", 60), grace, &other).is_err());
        std::thread::sleep(grace);
        assert_eq!(check(&at("a", 60), grace, &seen), Ok(()));
        assert_eq!(check(&at("c", 60), grace, &other), Ok(()));
    }
}
