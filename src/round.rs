//! One multiplexed round: the same command to every node, written to every
//! socket first, then every reply read against one deadline.
//!
//! A round knows sockets and deadlines, not what a reply means for the lock.
//! Any error or timeout on a connection drops that connection, so a reply
//! that arrives late is never read by anyone.

use std::time::{Duration, Instant};

use redis::Value;

use crate::node::{Conn, Failure, Node};
use crate::script::Command;

/// One node's result in a round: its reply or why there is none, and when.
pub(crate) struct Reply {
    pub(crate) result: Result<Value, Failure>,
    pub(crate) elapsed: Duration,
}

/// Where one node stands during a round.
struct Slot {
    /// The connection, while it is healthy.
    conn: Option<Conn>,
    /// The reply or failure, once there is one.
    result: Option<Result<Value, Failure>>,
    elapsed: Duration,
}

impl Slot {
    /// Writes the command; on failure the connection is dropped.
    fn send(&mut self, cmd: &Command, start: Instant, deadline: Instant) {
        if let Some(conn) = self.conn.as_mut() {
            if let Err(failure) = conn.send(cmd.bytes_for(conn.scripts), deadline) {
                self.finish(Err(failure), start);
            }
        }
    }

    /// Reads one reply if one is awaited; on failure the connection is dropped.
    fn receive(&mut self, start: Instant, deadline: Instant) {
        if self.result.is_none() {
            if let Some(conn) = self.conn.as_mut() {
                let result = conn.recv(deadline);
                self.finish(result, start);
            }
        }
    }

    fn finish(&mut self, result: Result<Value, Failure>, start: Instant) {
        if result.is_err() {
            self.conn = None;
        }
        self.result = Some(result);
        self.elapsed = start.elapsed();
    }

    /// Whether the node answered NOSCRIPT and can be asked again.
    fn lost_script(&self) -> bool {
        matches!(&self.result, Some(Ok(Value::ServerError(e))) if e.code() == "NOSCRIPT")
            && self.conn.is_some()
    }
}

/// Runs `cmd` on every node. Returns one reply a node, in node order.
///
/// Nothing in here blocks past `deadline`: every write, connect and read gets
/// only the time left until it.
pub(crate) fn run(
    nodes: &[Node],
    cmd: &Command,
    start: Instant,
    deadline: Instant,
    connect_timeout: Duration,
) -> Vec<Reply> {
    let mut slots: Vec<Slot> = nodes
        .iter()
        .map(|node| Slot {
            conn: node.checkout(),
            result: None,
            elapsed: Duration::ZERO,
        })
        .collect();
    // Write first to the nodes with an idle connection, so their replies
    // travel while we connect to the others.
    for slot in &mut slots {
        slot.send(cmd, start, deadline);
    }
    for (node, slot) in nodes.iter().zip(&mut slots) {
        if slot.conn.is_none() && slot.result.is_none() {
            match node.connect(deadline, connect_timeout) {
                Ok(conn) => {
                    slot.conn = Some(conn);
                    slot.send(cmd, start, deadline);
                }
                Err(failure) => slot.finish(Err(failure), start),
            }
        }
    }
    // Read every reply against the one deadline.
    for slot in &mut slots {
        slot.receive(start, deadline);
    }
    // A node that had lost our script gets it once more as EVAL, in the same
    // round and before the same deadline.
    if slots.iter().any(Slot::lost_script) {
        for slot in slots.iter_mut().filter(|s| s.lost_script()) {
            slot.result = None;
            if let Some(conn) = slot.conn.as_mut() {
                conn.scripts = 0;
            }
            slot.send(cmd, start, deadline);
        }
        for slot in &mut slots {
            slot.receive(start, deadline);
        }
    }

    nodes
        .iter()
        .zip(slots)
        .map(|(node, slot)| {
            let result = slot.result.unwrap_or(Err(Failure::TimedOut));
            match slot.conn {
                Some(mut conn) => {
                    if let (Some(script), Ok(reply)) = (cmd.script, &result) {
                        if !matches!(reply, Value::ServerError(_)) {
                            conn.scripts |= script.bit;
                        }
                    }
                    node.checkin(conn);
                }
                None => node.discard_idle(),
            }
            Reply {
                result,
                elapsed: slot.elapsed,
            }
        })
        .collect()
}
