//! The restarted-node guard: a node up for less than the grace period does
//! not vote.
//!
//! Why: see [`RedlockBuilder::restart_grace`](crate::RedlockBuilder::restart_grace).
//! Kept out until up longer than the longest TTL, a node that forgot its
//! locks lets every one of them expire first.
//!
//! `INFO server`, pipelined with the handshake, gives the uptime: no extra
//! round trip. Every new connection reads it. A new server process is
//! reached only through a new connection. One to a dead process fails, and
//! is never reused. So no round's command reaches a process younger than
//! the grace.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::Value;

use super::servers::info_fields;
use crate::error::NodeError;

/// What the guard saw of one node's restarts. It holds the `run_id` last
/// reached, and until when a seen restart keeps the node out (our clock).
#[derive(Default)]
pub(crate) struct Seen(Mutex<(Option<String>, Option<Instant>)>);

/// Checks an `INFO server` reply against the grace period. `Ok` if the node
/// has surely been up for `grace`, by its word and by what we saw (`seen`).
///
/// `uptime_in_seconds` is the difference of two whole-second readings of
/// the node's clock. So a node reporting `u` has been up more than `u - 1`
/// seconds, maybe not much more. That lower bound is compared with the
/// grace, erring on the side of refusing.
///
/// The node's clock may be stepped after it started (time sync after a bad
/// boot clock), and its uptime jumps. So a restart seen here keeps the node
/// out for the whole grace, on this client's clock. A restart is a new
/// `run_id`, or a first one younger than the grace.
///
/// A reply without a readable uptime is refused: a node that cannot show
/// its uptime does not vote.
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
