//! One node: what a round may ask of it (submit a command, wait for or poll
//! its reply, abandon it), over one connection that every thread shares;
//! and a round's [`Turn`] at the client's nodes, the one door to batching.
//!
//! - [`endpoint`]: the node URL, read once.
//! - [`connect`]: opening a connection within the round's deadline.
//! - [`shared`]: the shared connection: epochs, outbox, the writer and
//!   reader roles.
//! - [`transport`]: a socket split in a writing and a reading half.
//! - [`subscription`]: a connection of its own for listening to releases.
//! - [`resolve`], [`servers`], [`restart_guard`]: host names with a time
//!   bound, one vote per server process, the uptime check.
//! - [`owed`]: clean-ups that could not be sent, for the next connection.
//! - [`pace`]: batching, and yielding before parking: when queued commands
//!   are written.
//!
//! No async runtime, no background thread: the threads that want answers do
//! the I/O.

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

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use connect::Connector;
pub(crate) use endpoint::Endpoint;
use pace::{Pace, SpinWait, RECHECK};
pub(crate) use servers::Servers;
pub(crate) use shared::{Bounds, Ticket};
use shared::{Shared, Sleeper};
pub(crate) use subscription::{Listener, Message, Sender};
pub use transport::counts::{io_counts, IoCounts};

use crate::error::Failure;
use crate::script::{Command, Script};

/// One Redis master.
pub(crate) struct Node {
    connector: Connector,
    /// The shared connection, asked directly for what it knows.
    pub(crate) shared: Shared,
}

impl Node {
    /// The node at `endpoint`, the `index`th of a client whose nodes
    /// record in `servers` which server each reached (one server, one
    /// vote). Nothing is connected yet.
    ///
    /// With a `restart_grace` (a zero grace leaves it off) every new
    /// connection reads the server's uptime with `INFO server`, pipelined
    /// with the handshake, and fails with
    /// [`NodeError::Restarted`](crate::NodeError::Restarted) while the
    /// uptime is below the grace. After a connect timed out, the node does
    /// not connect again for `reconnect_backoff`.
    pub(crate) fn new(
        endpoint: Endpoint,
        index: usize,
        servers: Arc<Servers>,
        restart_grace: Duration,
        reconnect_backoff: Duration,
    ) -> Node {
        Node {
            connector: Connector {
                endpoint,
                restart_grace: Some(restart_grace).filter(|g| !g.is_zero()),
                index,
                servers,
                reconnect_backoff,
                owed: Default::default(),
            },
            shared: Shared::default(),
        }
    }

    /// The node's address for people: `host:port`, `tls host:port`, or the
    /// socket path.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.connector.endpoint.name
    }

    /// Queues `cmd` on the connection: with `eval` written now, a script
    /// as `EVAL`, otherwise left for the batch (see [`Shared::submit`]).
    pub(crate) fn submit(
        &self,
        cmd: &Command,
        bounds: Bounds,
        eval: bool,
    ) -> Result<Ticket, Failure> {
        Ok(self.shared.submit(&self.connector, cmd, bounds, eval)?.0)
    }

    /// Writes `cmd`, whose reply nobody reads, now: whether it is on the
    /// wire. Not when it failed, nor when it waits behind another thread's
    /// write or connect, which may yet fail (see [`Shared::submit`]).
    pub(crate) fn send(&self, cmd: &Command, bounds: Bounds) -> bool {
        let sent = self.shared.submit(&self.connector, cmd, bounds, true);
        sent.is_ok_and(|(ticket, written)| {
            self.abandon(ticket);
            written
        })
    }

    /// Writes what is queued on the connection: see [`Shared::flush`].
    fn flush(&self, bounds: Bounds, wake_reader: bool) {
        self.shared.flush(&self.connector, bounds, wake_reader);
    }

    /// The pace of the client's threads: the same for all its nodes.
    pub(crate) fn pace(&self) -> &Pace {
        &self.connector.servers.pace
    }

    /// Opens a subscription connection to this node, apart from the shared
    /// one, within `connect_timeout` and never past `deadline`. `None` if
    /// the node's connections cannot be split (TLS): see
    /// [`subscription`].
    pub(crate) fn subscribe_line(
        &self,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Option<(Sender, Listener)>, Failure> {
        subscription::open(&self.connector, deadline, connect_timeout)
    }

    /// Sends `cmd` (a release after a failed attempt) first thing on the
    /// node's next connection, unless `until` passed by then: for a
    /// clean-up that could not be sent now.
    pub(crate) fn owe(&self, cmd: &Command, until: Instant) {
        self.connector.owed.add(cmd.bytes_for(0).to_vec(), until);
    }

    /// The reply to `ticket` is no longer wanted: discard it when it comes.
    pub(crate) fn abandon(&self, ticket: Ticket) {
        self.shared.abandon(ticket, self.pace());
    }
}

/// One round's turn at the client's nodes: the requests it awaits, and
/// when its commands are written (the batching of [`pace`], behind this
/// one door). A round queues its command on the nodes through it, polls
/// and sleeps through it, and leaves it.
///
/// The turn holds the client's [`Pace`] while it queues its command on
/// every node, and again once woken with a reply, until it polls, sleeps
/// or leaves: the last thread to let go writes every node's queue, in one
/// write per node, as an event loop writes once all its tasks ran. A
/// thread alone is the last at once, and writes its own command, unless
/// enough other rounds await replies from its nodes (see
/// [`pace::BATCH_FROM`]): the threads those replies wake write it then,
/// with their own next commands. A command still queued after a sleep of
/// [`RECHECK`] (its writer is overdue), or past the batch's wait, is
/// written by its own thread; a round that leaves while it waits for a
/// batch writes its nodes' queues unless another thread is awake (the
/// last of those writes them).
pub(crate) struct Turn<'a> {
    nodes: &'a [Node],
    pace: &'a Pace,
    bounds: Bounds,
    /// The request awaited on each node: sent, its reply not taken yet.
    awaited: Vec<Option<Ticket>>,
    /// This thread holds the pace.
    held: bool,
    /// Our commands wait for the next batch until then.
    batch_until: Option<Instant>,
}

impl<'a> Turn<'a> {
    /// A round's turn at `nodes` (at least one), within `bounds`; nothing
    /// sent yet.
    pub(crate) fn new(nodes: &'a [Node], bounds: Bounds) -> Turn<'a> {
        Turn {
            nodes,
            pace: nodes[0].pace(),
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

    /// Sends `cmd` to node `i` once more, on a new connection, after its
    /// connection failed with `failure` (returned if the deadline has
    /// passed, or the new send fails with its own).
    pub(crate) fn resend(
        &mut self,
        i: usize,
        cmd: &Command,
        failure: Failure,
    ) -> Result<(), Failure> {
        if Instant::now() >= self.bounds.deadline {
            return Err(failure);
        }
        self.awaited[i] = Some(self.nodes[i].submit(cmd, self.bounds, false)?);
        Ok(())
    }

    /// Node `i` was sent the round's command (with [`Node::submit`]) as
    /// `ticket`.
    pub(crate) fn sent(&mut self, i: usize, ticket: Ticket) {
        self.awaited[i] = Some(ticket);
    }

    /// Queues `cmd` on the `connected` nodes, first, so that their replies
    /// travel while the round connects to the others. It is written with
    /// the commands of the client's other threads, in one write per node,
    /// by the last of them to let go of the pace: this thread, unless
    /// others are queuing too, or the round waits for the next batch (if
    /// it `may_batch`: it connects to no node). Returns whether each was
    /// queued.
    pub(crate) fn queue(
        &mut self,
        cmd: &Command,
        connected: &[usize],
        may_batch: bool,
    ) -> Vec<(usize, Result<(), Failure>)> {
        let alone = self.pace.hold();
        self.held = true;
        let mut queued = Vec::with_capacity(connected.len());
        for &i in connected {
            let sent = self.nodes[i].submit(cmd, self.bounds, false);
            self.awaited[i] = sent.as_ref().ok().copied();
            queued.push((i, sent.map(drop)));
        }
        if alone
            && may_batch
            && !connected.is_empty()
            && connected
                .iter()
                .all(|&i| self.nodes[i].shared.carries_batch())
        {
            self.batch_until = Some(Instant::now() + RECHECK);
        }
        self.let_go(false, self.batch_until.is_some());
        queued
    }

    /// Node `i`'s reply, if it can be had without sleeping: it is stored,
    /// or nobody else reads the connection (the read may block).
    ///
    /// The node's script cache bookkeeping, once the reply came: a script
    /// that ran is known to be cached on the connection's server, a
    /// `NOSCRIPT` says it is not. After a `NOSCRIPT` the command goes once
    /// more as `EVAL`, within the same deadline, and that reply is awaited
    /// instead.
    pub(crate) fn poll(&mut self, i: usize, cmd: &Command) -> Option<Result<Value, Failure>> {
        let ticket = self.awaited[i]?;
        if self.batch_until.is_some_and(|by| Instant::now() >= by) {
            // No batch came in time: write our commands ourselves.
            self.end_batch(false);
        }
        self.let_go(false, false);
        let node = &self.nodes[i];
        let reply = (node.shared).take(&node.connector, ticket, self.bounds, self.batch_until)?;
        self.awaited[i] = None;
        let noted = |s: &Script| {
            reply
                .as_ref()
                .is_ok_and(|v| node.shared.note_script(ticket, s.bit, v))
        };
        if cmd.script.is_some_and(noted) {
            match node.submit(cmd, self.bounds, true) {
                Ok(ticket) => self.awaited[i] = Some(ticket),
                Err(failure) => return Some(Err(failure)),
            }
            return None;
        }
        Some(reply)
    }

    /// Sleeps until `need` of the replies from `pending` are stored, or a
    /// reading role among them is free, or a connection ends, or the
    /// deadline or [`RECHECK`] passes. One wake-up, not one per node. The
    /// caller polls after.
    pub(crate) fn sleep_on(&mut self, pending: &[usize], need: usize) {
        self.let_go(false, false);
        let waiter = Sleeper::new(need);
        let mut enlisted = Vec::with_capacity(pending.len());
        let ready = pending.iter().any(|&i| {
            let Some(ticket) = self.awaited[i] else {
                return false;
            };
            let asleep = self.nodes[i].shared.enlist(ticket, &waiter);
            enlisted.extend(asleep.then_some((i, ticket)));
            !asleep
        });
        let until = self.bounds.deadline.min(Instant::now() + RECHECK);
        let mut spin = SpinWait::default();
        while !ready && !waiter.woken() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if !spin.spin() {
                std::thread::park_timeout(left);
            }
        }
        for &(i, ticket) in &enlisted {
            self.nodes[i].shared.delist(ticket);
        }
        self.held |= waiter.holds_pace();
        if !ready && !waiter.woken() && Instant::now() < self.bounds.deadline {
            // The thread owing the write of our command is overdue: write
            // what is queued ourselves.
            for &(i, ticket) in &enlisted {
                if !self.nodes[i].shared.written(ticket) {
                    self.nodes[i].flush(self.bounds, false);
                }
            }
        }
    }

    /// The round is decided: leaves node `i`'s reply to be read and
    /// discarded later, except on a connection with so many unread replies
    /// that it is drained now: then returns the reply.
    pub(crate) fn leave_unread(
        &mut self,
        i: usize,
        cmd: &Command,
    ) -> Option<Result<Value, Failure>> {
        let ticket = self.awaited[i]?;
        if !self.nodes[i].shared.backlogged(ticket) {
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

    /// Stops waiting for the next batch: writes the round's commands still
    /// queued; a round `leaving` writes whatever its nodes have queued (its
    /// abandoned commands among it), waking a reader for them, only if no
    /// other thread is awake: else the last of those writes it, with their
    /// own commands, in one write per node.
    fn end_batch(&mut self, leaving: bool) {
        if self.batch_until.take().is_some() {
            let last = leaving && !self.pace.others_awake();
            for (node, ticket) in self.nodes.iter().zip(&self.awaited) {
                if last || ticket.is_some_and(|t| !node.shared.written(t)) {
                    node.flush(self.bounds, leaving);
                }
            }
        }
    }

    /// Lets go of the pace, if held. The last thread to let go writes what
    /// every node has queued, and wakes a sleeper to read a node whose
    /// replies are due and unread; unless it goes on to read that node
    /// itself (it awaits a reply there and is not `leaving`): like an event
    /// loop, it then reads its nodes in turn, and the replies it reads wake
    /// the other threads. With `batch` (the round starts to wait for the
    /// next batch), it leaves the queues of its own nodes to that batch.
    fn let_go(&mut self, leaving: bool, batch: bool) {
        if !std::mem::take(&mut self.held) || !self.pace.release() {
            return;
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let reads_next = !leaving && self.awaits(i);
            if !(reads_next && batch) {
                node.flush(self.bounds, !reads_next);
            }
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.end_batch(true);
        self.let_go(true, false);
    }
}
