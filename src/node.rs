//! One node: what a round may ask of it (submit a command, wait for or poll
//! its reply, abandon it), over one connection that every thread shares.
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
//!
//! No async runtime, no background thread: the threads that want answers do
//! the I/O.

mod connect;
mod endpoint;
mod owed;
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
pub(crate) use servers::Servers;
pub(crate) use shared::Ticket;
use shared::{Dispatch, Shared};
pub(crate) use shared::{Enlisted, Pace, Waiter, FLUSH_GRACE, RECHECK};
pub(crate) use subscription::{Event, Listener, Sender};
pub use transport::counts::{io_counts, IoCounts};

use crate::error::Failure;
use crate::script::{is_noscript, Command};

/// One Redis master.
pub(crate) struct Node {
    connector: Connector,
    shared: Shared,
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
            shared: Shared::new(),
        }
    }

    /// The node's address for people: `host:port`, `tls host:port`, or the
    /// socket path.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.connector.endpoint.name
    }

    /// Queues `cmd` on the connection and gets it written: by this thread
    /// now, or, if another thread is writing, by that thread before it lets
    /// go. Connects first if there is no connection.
    pub(crate) fn submit(
        &self,
        cmd: &Command,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Ticket, Failure> {
        self.shared.submit(
            &self.connector,
            cmd,
            deadline,
            connect_timeout,
            Dispatch::Now,
        )
    }

    /// Queues `cmd` on the connection, to be written with other threads'
    /// commands by whoever lets go of the client's [`Pace`] last, who calls
    /// [`flush`](Self::flush) on every node. Without an open connection it
    /// is written now, as [`submit`](Self::submit) does.
    pub(crate) fn queue(
        &self,
        cmd: &Command,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Ticket, Failure> {
        self.shared.submit(
            &self.connector,
            cmd,
            deadline,
            connect_timeout,
            Dispatch::Queued,
        )
    }

    /// Writes what is queued on the connection (unless another thread is
    /// writing, which writes it before it lets go). With `wake_reader`,
    /// then wakes a sleeping thread to read the node if replies are due
    /// and nobody is awake to read them: false for a thread that reads the
    /// node next itself.
    pub(crate) fn flush(&self, deadline: Instant, connect_timeout: Duration, wake_reader: bool) {
        self.shared
            .flush(&self.connector, deadline, connect_timeout, wake_reader);
    }

    /// How many requests on the wire to this node have threads awaiting
    /// their replies (at least): those threads will be woken, and write
    /// what is queued by then. Zero for a node that does not answer
    /// quickly, or whose connection cannot be split (TLS): a command should
    /// not wait for a batch there.
    pub(crate) fn awaited_on_wire(&self) -> u64 {
        self.shared.awaited_on_wire()
    }

    /// The pace of the client's threads: the same for all its nodes.
    pub(crate) fn pace(&self) -> &Pace {
        &self.connector.servers.pace
    }

    /// Like [`submit`](Self::submit), but a script always goes as `EVAL`:
    /// for a request whose reply nobody will read, and for the retry after
    /// a `NOSCRIPT` (meanwhile another thread may have seen the script run
    /// and marked it cached again).
    pub(crate) fn submit_eval(
        &self,
        cmd: &Command,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Ticket, Failure> {
        self.shared.submit(
            &self.connector,
            cmd,
            deadline,
            connect_timeout,
            Dispatch::Eval,
        )
    }

    /// Waits for the reply to `cmd`, sent under `ticket`, reading it (and
    /// whatever comes before it) when no other thread is doing I/O. A
    /// script the server lost is sent again as `EVAL` and waited for, in
    /// the same round: see [`script_reply`](Self::script_reply). Sets
    /// `held` if the thread was woken with its reply: it holds the
    /// [`Pace`] then.
    pub(crate) fn wait(
        &self,
        cmd: &Command,
        ticket: Ticket,
        deadline: Instant,
        connect_timeout: Duration,
        held: &mut bool,
    ) -> Result<Value, Failure> {
        let reply = self.wait_raw(ticket, deadline, connect_timeout, held);
        self.script_reply(cmd, ticket, reply, deadline, connect_timeout, held)
    }

    /// Like [`wait`](Self::wait), but returns `None` instead of sleeping
    /// when another thread is doing I/O on the connection (or owes the
    /// write of the command). With `batch_until`, a command still queued
    /// waits until then for other threads to write it, even while none is
    /// awake (see [`crate::round`]).
    pub(crate) fn poll(
        &self,
        cmd: &Command,
        ticket: Ticket,
        deadline: Instant,
        connect_timeout: Duration,
        batch_until: Option<Instant>,
        held: &mut bool,
    ) -> Option<Result<Value, Failure>> {
        let reply = self.shared.take(
            &self.connector,
            ticket,
            deadline,
            connect_timeout,
            false,
            batch_until,
            held,
        )?;
        Some(self.script_reply(cmd, ticket, reply, deadline, connect_timeout, held))
    }

    /// Enlists `waiter` for the reply to `ticket`, so that it sleeps on
    /// several nodes at once: the reader that stores the reply counts it.
    /// [`Enlisted::Ready`] means: do not sleep, poll. An enlisted ticket
    /// must be [`delist`](Self::delist)ed once the waiter wakes.
    pub(crate) fn enlist(&self, ticket: Ticket, waiter: &Arc<Waiter>) -> Enlisted {
        self.shared.enlist(ticket, waiter)
    }

    /// Removes the waiter enlisted for `ticket`.
    pub(crate) fn delist(&self, ticket: Ticket) {
        self.shared.delist(ticket);
    }

    /// The reply to `ticket` as it came, with no script bookkeeping.
    fn wait_raw(
        &self,
        ticket: Ticket,
        deadline: Instant,
        connect_timeout: Duration,
        held: &mut bool,
    ) -> Result<Value, Failure> {
        self.shared
            .take(
                &self.connector,
                ticket,
                deadline,
                connect_timeout,
                true,
                None,
                held,
            )
            .unwrap_or(Err(Failure::TimedOut))
    }

    /// The node's script cache bookkeeping, once `reply` to `cmd` came: a
    /// script that ran is known to be cached on the connection's server, a
    /// `NOSCRIPT` says it is not. After a `NOSCRIPT` the command goes once
    /// more as `EVAL`, within the same deadline, and that reply is the
    /// answer.
    fn script_reply(
        &self,
        cmd: &Command,
        ticket: Ticket,
        reply: Result<Value, Failure>,
        deadline: Instant,
        connect_timeout: Duration,
        held: &mut bool,
    ) -> Result<Value, Failure> {
        let Some(script) = cmd.script else {
            return reply;
        };
        if !self.note_script(ticket, script.bit, &reply) {
            return reply;
        }
        let ticket = self.submit_eval(cmd, deadline, connect_timeout)?;
        // A thread holds the pace once, however many of its replies woke
        // it: a second hold would never be let go, and every later round's
        // queued commands would wait out their grace.
        let mut woken = false;
        let reply = self.wait_raw(ticket, deadline, connect_timeout, &mut woken);
        if woken && std::mem::replace(held, true) {
            self.pace().release();
        }
        self.note_script(ticket, script.bit, &reply);
        reply
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

    /// Whether writing to the node now means connecting first (it has no
    /// connection, and is not backing off reconnecting): that may block up
    /// to the connect timeout.
    pub(crate) fn will_connect(&self) -> bool {
        self.shared.will_connect()
    }

    /// How late this node tends to answer, coarsely (a power-of-two bucket
    /// of the average time a read of it blocked; the largest value once its
    /// last connection timed out): rounds read the nodes in this order, so
    /// a round that a quorum decided need not wait for the slow ones.
    pub(crate) fn lateness(&self) -> u32 {
        self.shared.lateness()
    }

    /// Whether the connection has so many unread replies that the next
    /// round should wait for its reply rather than leave it unread.
    pub(crate) fn backlogged(&self, ticket: Ticket) -> bool {
        self.shared.backlogged(ticket)
    }

    /// Whether the request `ticket` is on the wire (not still queued, nor
    /// lost with its connection before it was written).
    pub(crate) fn written(&self, ticket: Ticket) -> bool {
        self.shared.written(ticket)
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
