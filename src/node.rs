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
use pace::{Pace, SpinWait, BATCH_FROM, FLUSH_GRACE, RECHECK};
pub(crate) use servers::Servers;
pub(crate) use shared::{Bounds, Dispatch, Ticket};
use shared::{Enlisted, Shared, Waiter};
pub(crate) use subscription::{Event, Listener, Sender};
pub use transport::counts::{io_counts, IoCounts};

use crate::error::Failure;
use crate::script::{is_noscript, Command};

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

    /// Queues `cmd` on the connection and gets it written as `dispatch`
    /// says: [`Dispatch::Now`] by this thread now, or, if another thread is
    /// writing, by that thread before it lets go (connecting first if there
    /// is no connection); [`Dispatch::Eval`] likewise, but a script always
    /// goes as `EVAL` (for a request whose reply nobody will read, and for
    /// the retry after a `NOSCRIPT`: meanwhile another thread may have seen
    /// the script run and marked it cached again); [`Dispatch::Queued`]
    /// with other threads' commands, by whoever lets go of the client's
    /// [`Pace`] last (see [`Turn`]), or now without an open connection.
    pub(crate) fn submit(
        &self,
        cmd: &Command,
        bounds: Bounds,
        dispatch: Dispatch,
    ) -> Result<Ticket, Failure> {
        (self.shared).submit(&self.connector, cmd, bounds, dispatch)
    }

    /// Writes what is queued on the connection (unless another thread is
    /// writing, which writes it before it lets go). With `wake_reader`,
    /// then wakes a sleeping thread to read the node if replies are due
    /// and nobody is awake to read them: false for a thread that reads the
    /// node next itself.
    fn flush(&self, bounds: Bounds, wake_reader: bool) {
        self.shared.flush(&self.connector, bounds, wake_reader);
    }

    /// The pace of the client's threads: the same for all its nodes.
    pub(crate) fn pace(&self) -> &Pace {
        &self.connector.servers.pace
    }

    /// The reply to `cmd`, sent under `ticket`, read (and whatever comes
    /// before it) when no other thread is doing I/O. Unless `block`, `None`
    /// instead of sleeping when another thread is doing I/O on the
    /// connection (or owes the write of the command); with `batch_until`,
    /// a command still queued waits until then for other threads to write
    /// it, even while none is awake. Also returns whether the thread was
    /// woken with its reply: it holds the [`Pace`] then.
    ///
    /// The node's script cache bookkeeping, once the reply came: a script
    /// that ran is known to be cached on the connection's server, a
    /// `NOSCRIPT` says it is not. After a `NOSCRIPT` the command goes once
    /// more as `EVAL`, within the same deadline, and that reply is the
    /// answer.
    fn take(
        &self,
        cmd: &Command,
        ticket: Ticket,
        bounds: Bounds,
        (block, batch_until): (bool, Option<Instant>),
    ) -> (Option<Result<Value, Failure>>, bool) {
        let (reply, held) = (self.shared).take(&self.connector, ticket, bounds, block, batch_until);
        let Some(reply) = reply else {
            return (None, held);
        };
        let Some(script) = cmd
            .script
            .filter(|s| self.note_script(ticket, s.bit, &reply))
        else {
            return (Some(reply), held);
        };
        let ticket = match self.submit(cmd, bounds, Dispatch::Eval) {
            Ok(ticket) => ticket,
            Err(failure) => return (Some(Err(failure)), held),
        };
        let (reply, woken) = (self.shared).take(&self.connector, ticket, bounds, true, None);
        let reply = reply.unwrap_or(Err(Failure::TimedOut));
        // A thread holds the pace once, however many of its replies woke
        // it: a second hold would never be let go, and every later round's
        // queued commands would wait out their grace.
        if woken && held {
            self.pace().release();
        }
        self.note_script(ticket, script.bit, &reply);
        (Some(reply), held || woken)
    }

    /// Records what `reply` says about whether the server of `ticket`'s
    /// connection has the script `bit`. Returns whether the server lost it
    /// (`NOSCRIPT`).
    fn note_script(&self, ticket: Ticket, bit: u8, reply: &Result<Value, Failure>) -> bool {
        let Ok(value) = reply else {
            return false;
        };
        let lost = is_noscript(value);
        let ran = !matches!(value, Value::ServerError(_));
        if lost || ran {
            self.shared.note_script(ticket, bit, ran);
        }
        lost
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
/// and sleeps through it, and leaves it: every command it queued is
/// written by then, at the latest by this thread.
pub(crate) struct Turn<'a> {
    nodes: &'a [Node],
    bounds: Bounds,
    /// The request awaited on each node: sent, its reply not taken yet.
    awaited: Vec<Option<Ticket>>,
    /// This thread holds the client's [`Pace`]: from the start of the
    /// round until its commands are queued, and again once woken with a
    /// reply, until it blocks or leaves.
    held: bool,
    /// When a thread awake is overdue writing our queued commands.
    flush_by: Option<Instant>,
    /// Our commands wait for the next batch (see [`BATCH_FROM`]) until
    /// then, even while no thread is awake.
    batch_until: Option<Instant>,
}

impl<'a> Turn<'a> {
    /// A round's turn at `nodes`, within `bounds`; nothing sent yet.
    pub(crate) fn new(nodes: &'a [Node], bounds: Bounds) -> Turn<'a> {
        Turn {
            nodes,
            bounds,
            awaited: vec![None; nodes.len()],
            held: false,
            flush_by: None,
            batch_until: None,
        }
    }

    /// Whether the round awaits a reply from node `i`.
    pub(crate) fn awaits(&self, i: usize) -> bool {
        self.awaited[i].is_some()
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
    /// others are queuing too. Returns whether each was queued.
    ///
    /// A round that starts alone (no other thread awake) writes its
    /// command at once, unless at least [`BATCH_FROM`] other rounds await
    /// replies on the wire from each of its nodes (all split connections,
    /// that answer quickly) and it connects to no node (`may_batch`): the
    /// threads those replies wake write it then, with their own next
    /// commands, as an event loop would. The wait is bounded: the round
    /// writes its commands itself after [`FLUSH_GRACE`] (every read it
    /// makes meanwhile pauses then), and before it leaves or blocks on one
    /// node.
    pub(crate) fn queue(
        &mut self,
        cmd: &Command,
        connected: &[usize],
        may_batch: bool,
    ) -> Vec<(usize, Result<(), Failure>)> {
        let mut alone = false;
        if let Some(pace) = self.nodes.first().map(Node::pace).filter(|_| !self.held) {
            alone = pace.hold();
            self.held = true;
        }
        let mut queued = Vec::with_capacity(connected.len());
        for &i in connected {
            let sent = self.nodes[i].submit(cmd, self.bounds, Dispatch::Queued);
            self.awaited[i] = sent.as_ref().ok().copied();
            queued.push((i, sent.map(drop)));
        }
        let batch = may_batch
            && alone
            && !connected.is_empty()
            && (connected.iter()).all(|&i| self.nodes[i].shared.awaited_on_wire() >= BATCH_FROM);
        if batch {
            let by = Instant::now() + FLUSH_GRACE;
            self.batch_until = Some(by);
            self.flush_by = Some(by);
        }
        self.let_go(false, batch);
        queued
    }

    /// Node `i`'s reply, if it can be had without sleeping: it is stored,
    /// or nobody else reads the connection (the read may block).
    pub(crate) fn poll(&mut self, i: usize, cmd: &Command) -> Option<Result<Value, Failure>> {
        let ticket = self.awaited[i]?;
        if self.batch_until.is_some_and(|by| Instant::now() >= by) {
            // No batch came in time: write our commands ourselves.
            self.end_batch(false);
        }
        self.let_go(false, false);
        let (reply, held) = self.nodes[i].take(cmd, ticket, self.bounds, (false, self.batch_until));
        self.held |= held;
        if reply.is_some() {
            self.awaited[i] = None;
        }
        reply
    }

    /// Sleeps until `need` of the replies from `pending` are stored, or a
    /// reading role among them is free, or a connection ends, or the
    /// deadline (or, while a command is queued, the grace of the thread
    /// owing its write) passes. One wake-up, not one per node. The caller
    /// polls after.
    pub(crate) fn sleep_on(&mut self, pending: &[usize], need: usize) {
        self.let_go(false, false);
        let waiter = Waiter::new(need);
        let mut enlisted = Vec::with_capacity(pending.len());
        let (mut ready, mut queued) = (false, false);
        for &i in pending {
            let Some(ticket) = self.awaited[i] else {
                continue;
            };
            match self.nodes[i].shared.enlist(ticket, &waiter) {
                Enlisted::Ready => {
                    ready = true;
                    break;
                }
                Enlisted::Asleep { queued: q } => {
                    queued |= q;
                    enlisted.push((i, ticket));
                }
            }
        }
        let mut until = self.bounds.deadline.min(Instant::now() + RECHECK);
        if queued {
            let by = (self.flush_by).get_or_insert_with(|| Instant::now() + FLUSH_GRACE);
            until = until.min(*by);
        }
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
        if queued && !waiter.woken() && self.flush_by.is_some_and(|by| Instant::now() >= by) {
            // The thread owing the write is overdue: write it ourselves.
            for &(i, _) in &enlisted {
                self.nodes[i].flush(self.bounds, false);
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
        self.end_batch(true);
        self.let_go(false, false);
        self.awaited[i] = None;
        let (reply, held) = self.nodes[i].take(cmd, ticket, self.bounds, (true, None));
        self.held |= held;
        reply
    }

    /// Stops waiting for the next batch: writes the round's commands still
    /// queued. For a round that leaves, blocks on one node, or waited its
    /// [`FLUSH_GRACE`]; `wake_reader` as for [`Node::flush`].
    fn end_batch(&mut self, wake_reader: bool) {
        if self.batch_until.take().is_none() {
            return;
        }
        for (node, ticket) in self.nodes.iter().zip(&self.awaited) {
            if ticket.is_some_and(|t| !node.shared.written(t)) {
                node.flush(self.bounds, wake_reader);
            }
        }
    }

    /// Lets go of the pace, if held. The last thread to let go writes what
    /// every node has queued, and wakes a sleeper to read a node whose
    /// replies are due and unread; unless it goes on to read that node
    /// itself (it awaits a reply there and is not `leaving`): like an event
    /// loop, it then reads its nodes in turn, and the replies it reads wake
    /// the other threads. With `batch`, it leaves the queues of its own
    /// nodes for the next batch.
    fn let_go(&mut self, leaving: bool, batch: bool) {
        let pace = self.nodes.first().map(Node::pace);
        if !std::mem::take(&mut self.held) || !pace.is_some_and(Pace::release) {
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
