//! A node's subscription connection, on which waiters listen for releases
//! (see `crate::wait`). It is apart from the shared connection: a
//! subscribed connection can serve nothing else.
//!
//! It opens like any connection, and splits in two. A [`Sender`]
//! subscribes, unsubscribes and pings. A [`Listener`] reads what the server
//! pushes. One thread may block on the listener while another sends. A
//! read that times out loses nothing: a partial reply stays buffered. Both
//! speak of resources, not channels.

use std::time::{Duration, Instant};

use redis::Value;

use super::transport::{failure, Reader, Writer};
use super::Node;
use crate::error::Failure;
use crate::store::script::pack;
use crate::store::{released_channel, resource_of_channel};

/// Writes subscription commands. Their answers come through the [`Listener`], in order.
pub(crate) struct Sender(Writer);

/// Reads what the server pushes on a subscription connection.
pub(crate) struct Listener(Reader);

/// One thing the server pushed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// A release of this resource was published.
    Released(String),
    /// The connection listens for this resource's releases from now on.
    Subscribed(String),
    /// Any other answer: to an `UNSUBSCRIBE`, to a `PING`.
    Answer,
}

impl Node {
    /// Opens a subscription connection to this node, apart from the shared
    /// one, within `connect_timeout` and never past `deadline`. `None` if
    /// it cannot be split (TLS): a thread blocked reading it would keep the
    /// others from subscribing.
    pub(crate) fn subscribe_line(
        &self,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Option<(Sender, Listener)>, Failure> {
        let (writer, reader, _) = self.connect(deadline, connect_timeout)?;
        Ok(reader.map(|reader| (Sender(writer), Listener(reader))))
    }
}

impl Sender {
    /// Sends `commands` (`SUBSCRIBE`, `UNSUBSCRIBE`, `PING`) in one write,
    /// each with its resource's channel; a `PING` gets it back. Its answer
    /// shows the line still carries traffic: a partition keeps it silent.
    pub(crate) fn send(
        &mut self,
        commands: &[(&str, String)],
        deadline: Instant,
    ) -> Result<(), Failure> {
        let mut bytes = Vec::new();
        for (command, resource) in commands {
            let channel = released_channel(resource);
            pack(&mut bytes, &[command.as_bytes(), channel.as_bytes()]);
        }
        self.0.send(&bytes, deadline)
    }
}

impl Listener {
    /// The next thing the server pushes, by `deadline` at most. An error
    /// reply (a subscription refused) fails.
    pub(crate) fn next(&mut self, deadline: Instant) -> Result<Message, Failure> {
        let value = self.0.recv(deadline)?.extract_error();
        value.map(message).map_err(failure)
    }
}

/// A pushed value as a message.
fn message(value: Value) -> Message {
    let Ok((kind, channel, _)) = redis::from_redis_value::<(String, String, Value)>(value) else {
        return Message::Answer;
    };
    match (kind.as_str(), resource_of_channel(&channel)) {
        ("message", Some(resource)) => Message::Released(resource.to_string()),
        ("subscribe", Some(resource)) => Message::Subscribed(resource.to_string()),
        _ => Message::Answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn pushed_values_read_as_messages_on_resources() {
        let channel = released_channel("r");
        let released = Value::Array(vec![bulk("message"), bulk(&channel), bulk("tok")]);
        assert_eq!(message(released), Message::Released("r".to_string()));
        let subscribed = Value::Array(vec![bulk("subscribe"), bulk(&channel), Value::Int(1)]);
        assert_eq!(message(subscribed), Message::Subscribed("r".to_string()));
        let gone = Value::Array(vec![bulk("unsubscribe"), bulk(&channel), Value::Int(0)]);
        assert_eq!(message(gone), Message::Answer);
        assert_eq!(
            message(Value::Array(vec![bulk("pong"), bulk("")])),
            Message::Answer
        );
        assert_eq!(message(Value::SimpleString("PONG".into())), Message::Answer);
        let other = Value::Array(vec![bulk("message"), bulk("other"), bulk("tok")]);
        assert_eq!(message(other), Message::Answer, "not a channel of ours");
    }
}
