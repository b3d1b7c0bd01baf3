//! A node's subscription connection: the one a client's waiting threads
//! listen on for releases (see `crate::wait`), apart from the node's shared
//! connection, which a subscribed connection could no longer serve.
//!
//! It is opened like any connection (the same handshake, within the same
//! bounds) and split in two: a [`Sender`] that subscribes, unsubscribes and
//! pings, and a [`Listener`] that reads what the server pushes. One thread
//! may block on the listener while another subscribes through the sender.
//! A read that times out loses nothing: what came in part stays buffered
//! for the next read.

use std::time::Instant;

use redis::Value;

use super::connect::Connector;
use super::transport::{Reader, Writer};
use crate::error::{Failure, NodeError};
use crate::script::{pack, RELEASED_CHANNEL_PREFIX};

/// Writes subscription commands. Their answers come through the
/// [`Listener`], in order.
pub(crate) struct Sender(Writer);

/// Reads what the server pushes on a subscription connection.
pub(crate) struct Listener(Reader);

/// One thing the server pushed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A `PUBLISH` on a channel we subscribed to.
    Message { channel: Vec<u8>, payload: Vec<u8> },
    /// A `SUBSCRIBE` took effect.
    Subscribed(Vec<u8>),
    /// An `UNSUBSCRIBE` took effect.
    Unsubscribed(Vec<u8>),
    /// The answer to a `PING`.
    Pong,
}

/// Opens a subscription connection through `connector`, within
/// `connect_timeout` and never past `deadline`. `None` for a connection
/// that cannot be split (TLS through the `redis` crate): a thread blocked
/// reading it would keep every other thread from subscribing.
pub(super) fn open(
    connector: &Connector,
    deadline: Instant,
    connect_timeout: std::time::Duration,
) -> Result<Option<(Sender, Listener)>, Failure> {
    let opened = connector.connect(deadline, connect_timeout)?;
    Ok(opened
        .reader
        .map(|reader| (Sender(opened.writer), Listener(reader))))
}

impl Sender {
    /// `SUBSCRIBE` to the release channels of `subscribe`, `UNSUBSCRIBE`
    /// from those of `unsubscribe` (nothing for none), and, with `ping`, a
    /// `PING`: its answer shows the connection still carries traffic (a
    /// partition keeps a connection open but silent). One write, if any.
    pub(crate) fn send(
        &mut self,
        subscribe: &[String],
        unsubscribe: &[String],
        ping: bool,
        deadline: Instant,
    ) -> Result<(), Failure> {
        let mut bytes = Vec::new();
        for (name, resources) in [
            (&b"SUBSCRIBE"[..], subscribe),
            (b"UNSUBSCRIBE", unsubscribe),
        ] {
            let names: Vec<String> = (resources.iter())
                .map(|r| format!("{RELEASED_CHANNEL_PREFIX}{r}"))
                .collect();
            let mut args: Vec<&[u8]> = vec![name];
            args.extend(names.iter().map(|c| c.as_bytes()));
            if !names.is_empty() {
                pack(&mut bytes, &args);
            }
        }
        if ping {
            pack(&mut bytes, &[b"PING"]);
        }
        match bytes.is_empty() {
            true => Ok(()),
            false => self.0.send(&bytes, deadline),
        }
    }
}

impl Listener {
    /// The next thing the server pushes, waiting until `deadline` at most.
    pub(crate) fn next(&mut self, deadline: Instant) -> Result<Event, Failure> {
        let value = self.0.recv(deadline)?;
        event(value).map_err(|why| Failure::Error(NodeError::Protocol(why)))
    }
}

/// A pushed value as an event, or why it is not one.
fn event(value: Value) -> Result<Event, String> {
    let parts = match value {
        Value::Array(parts) | Value::Push { data: parts, .. } => parts,
        Value::SimpleString(s) if s.eq_ignore_ascii_case("PONG") => return Ok(Event::Pong),
        Value::ServerError(e) => {
            return Err(format!(
                "the subscription was refused: {} {}",
                e.code(),
                e.details().unwrap_or("")
            ))
        }
        other => return Err(format!("unexpected on a subscription: {other:?}")),
    };
    let mut parts = parts.into_iter().map(|part| match part {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    });
    let kind = parts.next().flatten().unwrap_or_default();
    let mut second = || parts.next().flatten().unwrap_or_default();
    match kind.to_ascii_lowercase().as_slice() {
        b"message" => Ok(Event::Message {
            channel: second(),
            payload: second(),
        }),
        b"subscribe" => Ok(Event::Subscribed(second())),
        b"unsubscribe" => Ok(Event::Unsubscribed(second())),
        b"pong" => Ok(Event::Pong),
        other => Err(format!(
            "unexpected on a subscription: {:?}",
            String::from_utf8_lossy(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn pushed_values_read_as_events() {
        let message = Value::Array(vec![bulk("message"), bulk("ch"), bulk("tok")]);
        assert_eq!(
            event(message),
            Ok(Event::Message {
                channel: b"ch".to_vec(),
                payload: b"tok".to_vec()
            })
        );
        let subscribed = Value::Array(vec![bulk("subscribe"), bulk("ch"), Value::Int(1)]);
        assert_eq!(event(subscribed), Ok(Event::Subscribed(b"ch".to_vec())));
        let gone = Value::Array(vec![bulk("unsubscribe"), bulk("ch"), Value::Int(0)]);
        assert_eq!(event(gone), Ok(Event::Unsubscribed(b"ch".to_vec())));
        assert_eq!(
            event(Value::Array(vec![bulk("pong"), bulk("")])),
            Ok(Event::Pong)
        );
        assert!(event(Value::Int(3)).is_err());
        assert!(event(Value::Array(vec![bulk("pmessage")])).is_err());
    }
}
