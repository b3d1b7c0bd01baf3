//! One node, over one connection all threads share: submit a command, poll
//! or wait for its reply, abandon it. And a round's [`Turn`] at the nodes,
//! the one door to batching. The submodules' heads say what each holds.
//!
//! No async runtime, no background thread: the threads that want answers
//! do the I/O.

mod connect;
mod endpoint;
mod owed;
mod pace;
mod resolve;
mod restart_guard;
mod servers;
mod shared;
mod subscription;
mod transport;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;

pub(crate) use endpoint::{redact, Endpoint};
use pace::{Pace, RECHECK, YIELDS};
pub(crate) use servers::Servers;
use shared::{After, Link, Sleeper};
pub(crate) use shared::{Bounds, Ticket, Write};
pub(crate) use subscription::{Listener, Message, Sender};
pub use transport::{io_counts, IoCounts};

use crate::error::Failure;
use crate::store::script::Command;

/// One Redis master.
pub(crate) struct Node {
    endpoint: Endpoint,
    /// The restarted-node guard's grace: a node up for less does not vote.
    restart_grace: Option<Duration>,
    /// This node's place, and the servers the client's nodes reached (by
    /// `run_id`). A node reaching a server another reached first does not
    /// vote.
    index: usize,
    servers: Arc<Servers>,
    /// How long to wait before connecting again after a connect timed out
    /// (see `Config::reconnect_backoff`).
    reconnect_backoff: Duration,
    /// Clean-ups the node could not be sent, for after the next handshake.
    owed: owed::Owed,
    /// The shared connection (see [`shared`]).
    link: Mutex<Link>,
}

impl Node {
    /// The client's `index`th node, at `endpoint`; not connected yet. A zero
    /// `restart_grace` turns the restart guard off.
    pub(crate) fn new(
        endpoint: Endpoint,
        index: usize,
        servers: Arc<Servers>,
        restart_grace: Duration,
        reconnect_backoff: Duration,
    ) -> Node {
        Node {
            endpoint,
            restart_grace: Some(restart_grace).filter(|g| !g.is_zero()),
            index,
            servers,
            reconnect_backoff,
            owed: Default::default(),
            link: Mutex::default(),
        }
    }

    /// The node's address for people: `host:port`, `tls host:port`, or the socket path.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.endpoint.name
    }

    /// Writes `cmd`, a clean-up, now, for no reader. If it is not on the
    /// wire (it failed, or waits behind another thread that may yet fail),
    /// it is owed: sent first on the next connection, unless `until` has
    /// passed. A release sent twice is harmless.
    pub(crate) fn send(&self, cmd: &Command, bounds: Bounds, until: Instant) {
        let sent = self.submit(cmd, bounds, Write::Now);
        sent.iter().for_each(|&(ticket, _)| self.abandon(ticket));
        if !sent.is_ok_and(|(_, written)| written) {
            self.owed.add(cmd.bytes_for(0).to_vec(), until);
        }
    }

    /// The pace of the client's threads, shared by all its nodes.
    pub(crate) fn pace(&self) -> &Pace {
        &self.servers.pace
    }
}

/// Where a round stands as it lets go of the pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Going {
    /// It goes on, and may read a node itself.
    Staying,
    /// It goes on, and leaves its own nodes' queues to the next batch.
    Batching,
    /// It is done: it reads nothing more.
    Leaving,
}

/// One round's turn at the client's nodes: the requests it awaits, and
/// when its commands are written. A round queues, polls, sleeps and leaves
/// through it; [`pace`]'s batching sits behind it, by the rules told there.
///
/// The turn holds the client's [`Pace`] while it queues, and again once a
/// reply wakes it. It lets go when it polls, sleeps or leaves.
pub(crate) struct Turn<'a> {
    nodes: &'a [Node],
    bounds: Bounds,
    /// The request awaited on each node: sent, its reply not taken yet.
    awaited: Vec<Option<Ticket>>,
    /// This thread holds the pace.
    held: bool,
    /// Our commands wait for the next batch until then.
    batch_until: Option<Instant>,
}

impl<'a> Turn<'a> {
    /// A round's turn at `nodes` (at least one), within `bounds`.
    pub(crate) fn new(nodes: &'a [Node], bounds: Bounds) -> Turn<'a> {
        Turn {
            nodes,
            bounds,
            awaited: vec![None; nodes.len()],
            held: false,
            batch_until: None,
        }
    }

    /// Whether the round awaits a reply from node `i`.
    pub(crate) fn awaits(&self, i: usize) -> bool {
        self.awaited[i].is_some()
    }

    /// Sends `cmd` to node `i` again, on a new connection, after `failure`.
    /// Returns `failure` past the deadline, or the new send's own.
    pub(crate) fn resend(
        &mut self,
        i: usize,
        cmd: &Command,
        failure: Failure,
    ) -> Result<(), Failure> {
        if Instant::now() >= self.bounds.deadline {
            return Err(failure);
        }
        self.awaited[i] = Some(self.nodes[i].submit(cmd, self.bounds, Write::Batched)?.0);
        Ok(())
    }

    /// Node `i` was sent the command ([`Node::submit`]) as `ticket`.
    pub(crate) fn sent(&mut self, i: usize, ticket: Ticket) {
        self.awaited[i] = Some(ticket);
    }

    /// Queues `cmd` on the `connected` nodes first, so their replies travel
    /// while the round connects to the others. It may wait for a batch only
    /// if it `may_batch` (connects to no node). Returns whether each was
    /// queued.
    pub(crate) fn queue(
        &mut self,
        cmd: &Command,
        connected: &[usize],
        may_batch: bool,
    ) -> Vec<(usize, Result<(), Failure>)> {
        let alone = self.nodes[0].pace().hold();
        self.held = true;
        let mut queued = Vec::with_capacity(connected.len());
        for &i in connected {
            let sent = self.nodes[i].submit(cmd, self.bounds, Write::Batched);
            self.awaited[i] = sent.as_ref().ok().map(|s| s.0);
            queued.push((i, sent.map(drop)));
        }
        let carried = |&i: &usize| self.nodes[i].carries_batch();
        if alone && may_batch && !connected.is_empty() && connected.iter().all(carried) {
            self.batch_until = Some(Instant::now() + RECHECK);
        }
        self.let_go(self.batch_until.map_or(Going::Staying, |_| Going::Batching));
        queued
    }

    /// Node `i`'s reply, if it needs no sleep. It is stored, or nobody else
    /// reads the connection (the read may block). After a `NOSCRIPT` the
    /// command goes again as `EVAL`, within the same deadline, and that
    /// reply is awaited.
    pub(crate) fn poll(&mut self, i: usize, cmd: &Command) -> Option<Result<Value, Failure>> {
        let ticket = self.awaited[i]?;
        if self.batch_until.is_some_and(|by| Instant::now() >= by) {
            // No batch came in time: write our commands ourselves.
            self.end_batch(Going::Staying);
        }
        self.let_go(Going::Staying);
        let node = &self.nodes[i];
        let reply = node.take(ticket, self.bounds, self.batch_until)?;
        self.awaited[i] = None;
        let noscript = match (cmd.script, &reply) {
            (Some(script), Ok(v)) => node.note_script(ticket, script.bit, v),
            _ => false,
        };
        if noscript {
            let resent = node.submit(cmd, self.bounds, Write::Now);
            self.awaited[i] = resent.as_ref().ok().map(|s| s.0);
            return resent.err().map(Err);
        }
        Some(reply)
    }

    /// Sleeps until `need` replies from `pending` are stored, or a reader
    /// role frees up. A closed connection, the deadline or [`RECHECK`] also
    /// ends it. One wake-up, not one per node. The caller polls after.
    pub(crate) fn sleep_on(&mut self, pending: &[usize], need: usize) {
        self.let_go(Going::Staying);
        let waiter = Sleeper::new(need);
        let mut enlisted = Vec::with_capacity(pending.len());
        let mut awaited = pending.iter().filter_map(|&i| Some((i, self.awaited[i]?)));
        let ready = awaited.any(|(i, ticket)| {
            let asleep = self.nodes[i].enlist(ticket, &waiter);
            enlisted.extend(asleep.then_some((i, ticket)));
            !asleep
        });
        let until = self.bounds.deadline.min(Instant::now() + RECHECK);
        let mut yields = 0..YIELDS;
        while !ready && !waiter.woken() {
            let left = until.saturating_duration_since(Instant::now());
            match yields.next() {
                _ if left.is_zero() => break,
                Some(_) => std::thread::yield_now(),
                None => std::thread::park_timeout(left),
            }
        }
        for &(i, ticket) in &enlisted {
            self.nodes[i].delist(ticket);
        }
        self.held |= waiter.holds_pace();
        if !ready && !waiter.woken() && Instant::now() < self.bounds.deadline {
            // The thread owing our write is overdue: write it ourselves.
            for &(i, ticket) in &enlisted {
                if !self.nodes[i].written(ticket) {
                    self.nodes[i].flush(self.bounds, After::ReadHere);
                }
            }
        }
    }

    /// The round is decided: node `i`'s reply is discarded later. A
    /// connection with too many unread replies is drained now instead, and
    /// the reply returned.
    pub(crate) fn leave_unread(
        &mut self,
        i: usize,
        cmd: &Command,
    ) -> Option<Result<Value, Failure>> {
        let ticket = self.awaited[i]?;
        if !self.nodes[i].backlogged(ticket) {
            self.awaited[i] = None;
            self.nodes[i].abandon(ticket);
            return None;
        }
        loop {
            if let Some(reply) = self.poll(i, cmd) {
                return Some(reply);
            }
            self.sleep_on(&[i], 1);
        }
    }

    /// Stops waiting for the next batch and writes the round's queued
    /// commands. A round [`Going::Leaving`] writes all its nodes' queues and
    /// wakes a reader, if no other thread is awake. Else the last awake
    /// writes them.
    fn end_batch(&mut self, go: Going) {
        if self.batch_until.take().is_some() {
            let (last, after) = match go {
                Going::Leaving => (!self.nodes[0].pace().others_awake(), After::WakeReader),
                _ => (false, After::ReadHere),
            };
            for (node, ticket) in self.nodes.iter().zip(&self.awaited) {
                if last || ticket.is_some_and(|t| !node.written(t)) {
                    node.flush(self.bounds, after);
                }
            }
        }
    }

    /// Lets go of the pace, if held. The last thread to let go writes every
    /// node's queue, and wakes a sleeper to read a node with unread replies.
    /// It reads that node itself instead if it awaits a reply there and is
    /// not leaving.
    fn let_go(&mut self, go: Going) {
        if !std::mem::take(&mut self.held) || !self.nodes[0].pace().release() {
            return;
        }
        for (i, node) in self.nodes.iter().enumerate() {
            match (go, self.awaits(i)) {
                (Going::Leaving, _) | (_, false) => node.flush(self.bounds, After::WakeReader),
                (Going::Batching, true) => {}
                (Going::Staying, true) => node.flush(self.bounds, After::ReadHere),
            }
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.end_batch(Going::Leaving);
        self.let_go(Going::Leaving);
    }
}
