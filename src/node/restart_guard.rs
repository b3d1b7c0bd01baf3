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

use std::time::Duration;

use redis::Value;

use super::servers::info_field;
use crate::error::NodeError;
use crate::script::pack;

/// `INFO server`, packed, to send with the handshake.
pub(crate) fn info_server() -> Vec<u8> {
    let mut out = Vec::new();
    pack(&mut out, &[b"INFO", b"server"]);
    out
}

/// Checks an `INFO server` reply against the grace period: `Ok` if the node
/// has certainly been up for at least `grace`.
///
/// `uptime_in_seconds` is the difference of two whole-second readings of
/// the node's clock (now, and when it started), so a node that reports `u`
/// seconds has been up for more than `u - 1` seconds and possibly not much
/// more: that lower bound is what is compared with the grace, which errs on
/// the side of refusing.
///
/// A reply without a readable uptime is refused too: with the guard on, a
/// node that cannot show how long it has been up does not vote.
pub(crate) fn check(info: &Value, grace: Duration) -> Result<(), NodeError> {
    let uptime = uptime(info).ok_or_else(|| {
        NodeError::Protocol(
            "INFO server has no readable uptime_in_seconds; the restart guard cannot tell how long the node has been up"
                .to_string(),
        )
    })?;
    if uptime.saturating_sub(Duration::from_secs(1)) < grace {
        Err(NodeError::Restarted { uptime, grace })
    } else {
        Ok(())
    }
}

/// `uptime_in_seconds` from an `INFO` reply.
fn uptime(info: &Value) -> Option<Duration> {
    info_field(info, "uptime_in_seconds")
        .and_then(|secs| secs.parse::<u64>().ok())
        .map(Duration::from_secs)
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
        assert_eq!(check(&info("61"), Duration::from_secs(60)), Ok(()));
        assert_eq!(check(&info("3600"), Duration::from_secs(60)), Ok(()));
        assert_eq!(check(&info("0"), Duration::ZERO), Ok(()));
    }

    #[test]
    fn a_node_maybe_up_for_less_than_the_grace_is_refused() {
        // 60 read means anywhere above 59 s: maybe less than 60 s.
        assert_eq!(
            check(&info("60"), Duration::from_secs(60)),
            Err(NodeError::Restarted {
                uptime: Duration::from_secs(60),
                grace: Duration::from_secs(60)
            })
        );
        // 2 read means anywhere above 1 s: not surely 1.5 s.
        assert!(check(&info("2"), Duration::from_millis(1500)).is_err());
        assert!(check(&info("3"), Duration::from_millis(1500)).is_ok());
        assert!(check(&info("0"), Duration::from_millis(1)).is_err());
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
                    check(&reply, Duration::from_secs(1)),
                    Err(NodeError::Protocol(_))
                ),
                "{reply:?} was not refused as unreadable"
            );
        }
    }

    #[test]
    fn info_server_is_one_resp_command() {
        assert_eq!(info_server(), b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n");
    }
}
