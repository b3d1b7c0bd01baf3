//! The shared connection of one node: every thread that has a command for
//! the node queues it here, and the threads that want answers do the I/O.
//!
//! Threads batch their commands on the shared connection, as an event loop
//! does: a round queues its command on every node's outbox, and the last of
//! the client's threads to fall asleep (see [`Pace`]) writes every outbox in
//! one write per node. A thread alone writes its own command at once
//! (unless a batch is due soon: see `Turn` in [`crate::node`]). Writing
//! and reading are separate roles: a command never waits for a read to
//! return (except over TLS, whose connection cannot be split: there its
//! reader writes what was queued once its read returns). A thread whose own command
//! waits in the queue may read meanwhile, but its read pauses when the
//! wait ([`FLUSH_GRACE`]) is over, and it writes the command. Replies come
//! back in order: each is matched to its request by sequence number and handed
//! to the thread that asked (or discarded, if that thread stopped waiting).
//! A reader hands out every reply one read brought. A round sleeps once,
//! on all its nodes at a time (a [`Waiter`]): readers count its replies,
//! and the one that stores as many as could decide the round wakes it
//! (`thread::park` / `unpark`; before it parks, a round yields the CPU a
//! few times, and a reply stored meanwhile needs no wake-up: see
//! [`SpinWait`](super::pace::SpinWait)). A reader that lets the reading role go with
//! replies due wakes a sleeper to read on only when no thread is awake to
//! poll the node, and one sleeper woken to read serves every node it
//! waits on (see [`hand_off`]).
//!
//! Any error or timeout on the connection ends its *epoch*: the connection is
//! dropped for every thread that shared it, and every request still on it
//! fails. A reply is never matched across epochs, so a late reply can never
//! be taken for the answer to another command.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use redis::Value;

use super::connect::Connector;
use super::pace::{Pace, FLUSH_GRACE, RECHECK};
use super::transport::{Reader, Writer};
use crate::error::{Failure, NodeError};
use crate::script::{is_noscript, Command};

/// Past this many unread replies on a connection, a round waits for its
/// reply even after the outcome is decided, draining the backlog (or, on a
/// hung node, ending the connection). A node that is always read last (the
/// slowest) is read at least every this many rounds, so it learns soon
/// enough what its unread replies said (a `NOSCRIPT` after `SCRIPT FLUSH`:
/// until then, its unread releases do not happen); and a merely slow node
/// holds up one round in this many.
const MAX_BACKLOG: u64 = 32;

/// The bounds of one round's I/O: nothing blocks past `deadline`, and a
/// connect takes at most `connect_timeout`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) deadline: Instant,
    pub(crate) connect_timeout: Duration,
}

/// A request on a node's connection: which epoch, and its place in line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    epoch: u64,
    seq: u64,
}

/// A node's shared connection: what its threads share, behind a mutex.
#[derive(Default)]
pub(crate) struct Shared {
    link: Mutex<Link>,
}

/// How a command goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dispatch {
    /// Written now.
    Now,
    /// Written now, a script as `EVAL` whatever the server is known to have.
    Eval,
    /// Written with other threads' commands, when the pace says.
    Queued,
}

/// A thread asleep until enough of its replies come, on any of the nodes
/// it waits on (a round waits on all its nodes at once), or until the
/// reading role of one of them is free: one wake-up per round, not one per
/// node. Readers count its replies; the one that stores the `need`th
/// wakes it.
pub(crate) struct Waiter {
    thread: Thread,
    need: usize,
    stored: AtomicUsize,
    /// `AWAKE_NO`, `AWAKE_REPLY` or `AWAKE_OTHER`: set once, by the thread
    /// that wakes it, with the lock of the node where it did held.
    woken: AtomicU8,
}

/// Not woken yet.
const AWAKE_NO: u8 = 0;
/// Woken with its replies stored: it holds the pace (see [`Pace`]).
const AWAKE_REPLY: u8 = 1;
/// Woken to take a reading role over, or because an epoch ended.
const AWAKE_OTHER: u8 = 2;

impl Waiter {
    /// A waiter for this thread, woken once `need` of its replies are
    /// stored (at least one).
    pub(crate) fn new(need: usize) -> Arc<Waiter> {
        Arc::new(Waiter {
            thread: thread::current(),
            need: need.max(1),
            stored: AtomicUsize::new(0),
            woken: AtomicU8::new(AWAKE_NO),
        })
    }

    /// Whether it was woken.
    pub(crate) fn woken(&self) -> bool {
        self.woken.load(Ordering::Acquire) != AWAKE_NO
    }

    /// Whether it was woken with its replies stored: it holds the pace
    /// then. Read it once the waiter is delisted from every node.
    pub(crate) fn holds_pace(&self) -> bool {
        self.woken.load(Ordering::Acquire) == AWAKE_REPLY
    }

    /// Wakes it, unless it was woken already: marks it woken now, and
    /// leaves its thread in `wakes` to unpark once the node's lock is let
    /// go (see [`Locked`]). Returns whether this call woke it.
    fn wake(&self, why: u8, wakes: &mut Vec<Thread>) -> bool {
        let woke = self
            .woken
            .compare_exchange(AWAKE_NO, why, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if woke {
            wakes.push(self.thread.clone());
        }
        woke
    }
}

/// A request whose thread sleeps until its reply comes.
struct Sleeper {
    ticket: Ticket,
    waiter: Arc<Waiter>,
    /// Its reply was stored (and counted for its waiter).
    stored: bool,
}

/// What [`Shared::enlist`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enlisted {
    /// Do not sleep: the reply is stored, the reading role is free with
    /// replies due, or the epoch ended.
    Ready,
    /// Enlisted; `queued` if the command is not written yet (a thread
    /// awake owes its write).
    Asleep { queued: bool },
}

/// Everything behind a node's mutex: the connection of the current epoch,
/// and what outlives it.
#[derive(Default)]
struct Link {
    /// Bumped whenever the connection is dropped.
    epoch: u64,
    /// The connection of this epoch (none open yet, if `!conn.open`).
    conn: Connection,
    /// Why the last epoch ended.
    ended: Option<(u64, Failure)>,
    /// The threads blocked waiting for their replies (or for the reading
    /// role): a thread that stores one of these replies wakes exactly that
    /// sleeper; one that lets the reading role go while replies are due
    /// wakes one sleeper to take it over; the end of an epoch wakes all.
    /// Nobody else is woken: every thread woken for nothing costs a
    /// context switch and two syscalls.
    sleepers: Vec<Sleeper>,
    /// The last connection ended in a timeout, and no reply came since.
    slow: bool,
    /// No connect before this, after one timed out.
    connect_after: Option<Instant>,
    /// A moving average of how long a read of this node blocked, in
    /// microseconds: rounds read the nodes that keep them waiting last.
    wait_us: u64,
    /// Threads woken under the lock, to unpark once it is let go: an
    /// unpark is a syscall, and the other threads need the lock meanwhile.
    wakes: Vec<Thread>,
}

/// A node's lock, held: unparks the threads woken under it once it is let
/// go, so that no thread waits for the lock while the holder makes those
/// syscalls (nor wakes only to wait for the lock its waker still holds).
struct Locked<'a> {
    guard: Option<MutexGuard<'a, Link>>,
}

impl Deref for Locked<'_> {
    type Target = Link;

    fn deref(&self) -> &Link {
        self.guard.as_deref().expect("held until dropped")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Link {
        self.guard.as_deref_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // (An empty list keeps its capacity for the next wake-ups.)
        if let Some(mut guard) = self.guard.take().filter(|g| !g.wakes.is_empty()) {
            let wakes = std::mem::take(&mut guard.wakes);
            drop(guard);
            wakes.iter().for_each(Thread::unpark);
        }
    }
}

/// One connection, from its connect to the end of its epoch: its halves,
/// who holds them, and the requests on it. Ending the epoch replaces it
/// with a fresh `Connection::default()` in one assignment, so nothing of
/// one connection is left over for the next.
///
/// # Who holds the halves
///
/// A half lies here while no thread holds it. A thread takes it, with the
/// lock held, when it takes its role; does its I/O without the lock; and
/// puts it back, unless the epoch ended meanwhile (then it drops it).
///
/// | `writing` | `reading` | split (TCP, Unix socket) | unsplit (TLS) |
/// |---|---|---|---|
/// | no  | no  | both halves lie here | `writer` lies here |
/// | yes | no  | a thread writes with `writer` | a thread writes with `writer` |
/// | no  | yes | a thread reads with `reader` | (never) |
/// | yes | yes | one thread writes, another reads; or one thread connects, and holds both roles until the handshake is over | one thread reads with `writer`, then writes what was queued meanwhile |
///
/// A thread may take the writing role while `writing` is false, and the
/// reading role when [`can_read`]: `reading` is false and, on an unsplit
/// connection, `writing` too. Whoever ends the epoch shuts down the halves
/// that lie here; a thread that holds one finds out when its I/O fails.
#[derive(Default)]
struct Connection {
    /// A connection is open in this epoch (or being opened).
    open: bool,
    /// The connection cannot be split (TLS): its writer also reads, so the
    /// reading role takes the writing role too.
    unsplit: bool,
    /// The connection's writing half, unless the writing thread holds it.
    writer: Option<Writer>,
    /// The reading half, unless the reading thread holds it (none for an
    /// unsplit connection).
    reader: Option<Reader>,
    /// A thread is writing (it has taken `writer`).
    writing: bool,
    /// A thread is reading (it has taken `reader`, or on an unsplit
    /// connection `writer`).
    reading: bool,
    /// Bits of the scripts known to be cached on this connection's server.
    scripts: u8,
    /// Packed commands not written yet, in sequence order.
    outbox: Vec<u8>,
    /// Sequence number of the next request.
    next_seq: u64,
    /// Requests below this sequence number are on the wire.
    written: u64,
    /// Sequence number of the next reply to read.
    next_read: u64,
    /// Replies read and not yet taken by their threads.
    replies: Vec<(u64, Value)>,
    /// One flag per request not read yet, from `next_read` on: whether its
    /// thread stopped waiting, so that its reply is discarded. (Never
    /// replayed: a command sent again later could land behind a later
    /// command of ours and undo it.)
    abandoned: VecDeque<bool>,
    /// Requests whose threads still want the reply (not read, not
    /// abandoned).
    live: u64,
}

impl Shared {
    fn lock(&self) -> Locked<'_> {
        Locked {
            guard: Some(self.link.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Queues `cmd` on the connection and, as `dispatch` says, gets it written
    /// now or leaves it for whoever lets go of the client's [`Pace`] last
    /// (see [`flush`](Self::flush)). Written now means: by this thread, or,
    /// if another thread is writing, by that thread before it lets go; and
    /// connected first if there is no connection. A command to queue on a
    /// connection not open yet is written now too: a connect must not wait.
    pub(super) fn submit(
        &self,
        connector: &Connector,
        cmd: &Command,
        bounds: Bounds,
        dispatch: Dispatch,
    ) -> Result<Ticket, Failure> {
        let mut link = self.lock();
        let scripts = if dispatch == Dispatch::Eval {
            0
        } else {
            link.conn.scripts
        };
        link.conn.outbox.extend_from_slice(cmd.bytes_for(scripts));
        let ticket = Ticket {
            epoch: link.epoch,
            seq: link.conn.next_seq,
        };
        link.conn.next_seq += 1;
        link.conn.abandoned.push_back(false);
        link.conn.live += 1;
        if dispatch == Dispatch::Queued && link.conn.open {
            return Ok(ticket);
        }
        link = self.write_out(link, connector, bounds, true);
        check(&link, ticket)?;
        Ok(ticket)
    }

    /// Whether the request `ticket` is on the wire: false while it waits in
    /// the outbox (another thread writing, or connecting), and for good once
    /// its connection ended before it was written.
    pub(crate) fn written(&self, ticket: Ticket) -> bool {
        let link = self.lock();
        link.epoch == ticket.epoch && ticket.seq < link.conn.written
    }

    /// How many requests whose threads await their replies are on the
    /// wire (at least): each of those threads will be woken once its
    /// replies are read, and write what is queued by then. None counted
    /// unless the node [answers quickly](answers_quickly): a command
    /// queued to wait for them would wait a whole round trip.
    pub(super) fn awaited_on_wire(&self) -> u64 {
        let link = self.lock();
        if !answers_quickly(&link) || link.conn.unsplit {
            // An unsplit connection's read cannot pause for our command.
            return 0;
        }
        let queued = link.conn.next_seq - link.conn.written;
        link.conn.live.saturating_sub(queued)
    }

    /// Writes what is queued, unless another thread is writing (which
    /// writes it before it lets go). With `wake_reader`, then wakes a
    /// sleeper to read if replies are due, nobody reads them and no thread
    /// is awake (see [`hand_off`]); a thread that goes on to read the node
    /// itself passes false, so that nobody is woken to find the reading
    /// role taken.
    pub(super) fn flush(&self, connector: &Connector, bounds: Bounds, wake_reader: bool) {
        let mut link = self.lock();
        if !link.conn.outbox.is_empty() {
            drop(self.write_out(link, connector, bounds, wake_reader));
        } else if wake_reader {
            // Nothing to write, but replies may be due with nobody to read
            // them, now that the last thread awake lets go.
            hand_off(&mut link, &connector.servers.pace);
        }
    }

    /// Takes the reply to `ticket`, reading it (and whatever comes before
    /// it) when no other thread is doing I/O. Unless `block`, returns `None`
    /// instead of sleeping while another thread does the I/O. Also returns
    /// whether the thread was woken with its reply: it holds the client's
    /// [`Pace`] then, and must let go of it before it blocks again.
    ///
    /// A command still queued is written by this thread when no other
    /// thread is awake to write it, or after [`FLUSH_GRACE`]; with
    /// `batch_until`, it waits until then for the next batch even while
    /// nobody is awake (the threads woken by the replies on the wire write
    /// it); a poll returns `None` once that time is past, so that the round
    /// writes its queued commands before any read may block.
    pub(super) fn take(
        &self,
        connector: &Connector,
        ticket: Ticket,
        bounds: Bounds,
        block: bool,
        batch_until: Option<Instant>,
    ) -> (Option<Result<Value, Failure>>, bool) {
        let mut link = self.lock();
        let mut held = false;
        // When to stop waiting for other threads to write our command.
        let mut flush_by = batch_until;
        let taken = loop {
            let now = Instant::now();
            let next = match taken_now(&mut link, ticket) {
                Some(taken) => break Some(taken),
                None if !block && batch_until.is_some_and(|by| now >= by) => {
                    // No batch came in time: back to the round, which writes
                    // every command it left queued before a read may block.
                    break None;
                }
                None => next_step(
                    &mut link,
                    &connector.servers.pace,
                    ticket,
                    bounds.deadline,
                    batch_until,
                    &mut flush_by,
                    now,
                ),
            };
            match next {
                Step::Write => link = self.write_out(link, connector, bounds, false),
                Step::Read { pause } => {
                    // While our command waits, a read pauses when its wait
                    // is over: it never waits behind a read of a slow node.
                    // So does a read while the round's commands on other
                    // nodes wait for the batch.
                    let pause = pause.or(batch_until);
                    link = self.read_one(link, connector, bounds, pause);
                }
                Step::Done(taken) => break Some(taken),
                Step::Sleep(_) if !block => break None,
                Step::Sleep(until) => {
                    let waiter = Waiter::new(1);
                    enlist(&mut link, ticket, &waiter);
                    drop(link);
                    thread::park_timeout(until.min(now + RECHECK).saturating_duration_since(now));
                    link = self.lock();
                    delist(&mut link, ticket);
                    held |= waiter.holds_pace();
                }
            }
        };
        hand_off(&mut link, &connector.servers.pace);
        (taken, held)
    }

    /// Enlists `waiter` for the reply to `ticket`: the reader that stores
    /// it counts it, and wakes the waiter once it has its `need`. Unless
    /// the waiter need not sleep: see [`Enlisted`]. Every enlisted ticket
    /// must be [`delist`](Self::delist)ed once the waiter wakes.
    pub(super) fn enlist(&self, ticket: Ticket, waiter: &Arc<Waiter>) -> Enlisted {
        let mut link = self.lock();
        let conn = &link.conn;
        if link.epoch != ticket.epoch
            || conn.replies.iter().any(|(seq, _)| *seq == ticket.seq)
            || (conn.next_read < conn.written && can_read(conn))
        {
            return Enlisted::Ready;
        }
        let queued = ticket.seq >= conn.written && !conn.writing;
        enlist(&mut link, ticket, waiter);
        Enlisted::Asleep { queued }
    }

    /// Removes the waiter enlisted for `ticket`.
    pub(super) fn delist(&self, ticket: Ticket) {
        delist(&mut self.lock(), ticket);
    }

    /// Whether writing to the node now means connecting first (it has no
    /// connection, and is not backing off reconnecting): that may block up
    /// to the connect timeout.
    pub(crate) fn will_connect(&self) -> bool {
        let link = self.lock();
        !link.conn.open
            && !link.conn.writing
            && link
                .connect_after
                .is_none_or(|after| after <= Instant::now())
    }

    /// How late this node tends to answer, coarsely (a power-of-two bucket
    /// of the average time a read of it blocked; the largest value once its
    /// last connection timed out): rounds read the nodes in this order, so
    /// a round that a quorum decided need not wait for the slow ones.
    pub(crate) fn lateness(&self) -> u32 {
        let link = self.lock();
        if link.slow {
            u32::MAX
        } else {
            link.wait_us.max(1).ilog2()
        }
    }

    /// Whether the connection has so many unread replies that the next
    /// round should wait for its reply rather than leave it unread.
    pub(super) fn backlogged(&self, ticket: Ticket) -> bool {
        let link = self.lock();
        link.epoch == ticket.epoch && ticket.seq >= link.conn.next_read + MAX_BACKLOG
    }

    /// The reply to `ticket` is no longer wanted: discard it when it comes.
    /// The thread will not read the node: if replies are due there and
    /// nobody reads them, a sleeper is woken to (see [`hand_off`]).
    pub(super) fn abandon(&self, ticket: Ticket, pace: &Pace) {
        let mut link = self.lock();
        if link.epoch != ticket.epoch {
            return;
        }
        match take_stored(&mut link.conn, ticket.seq) {
            Some(reply) => forget_scripts_if_lost(&mut link.conn, &reply),
            None => give_up(&mut link.conn, ticket.seq),
        }
        hand_off(&mut link, pace);
    }

    /// Records whether the server of `ticket`'s connection has `script`.
    pub(super) fn note_script(&self, ticket: Ticket, bit: u8, known: bool) {
        let mut link = self.lock();
        if link.epoch == ticket.epoch {
            let others = link.conn.scripts & !bit;
            link.conn.scripts = others | if known { bit } else { 0 };
        }
    }

    /// The writing role: writes the outbox until it is empty (connecting
    /// first if there is no connection), then lets go. If another thread is
    /// writing, it writes the outbox before it lets go. The lock is not held
    /// during I/O. With `wake_reader`, wakes a sleeper to read what was
    /// written when nobody reads it (see [`hand_off`]).
    fn write_out<'a>(
        &'a self,
        mut link: Locked<'a>,
        connector: &Connector,
        bounds: Bounds,
        wake_reader: bool,
    ) -> Locked<'a> {
        if link.conn.writing || link.conn.outbox.is_empty() {
            return link;
        }
        let epoch = link.epoch;
        link.conn.writing = true;
        // Nobody reads a connection before its handshake is over.
        let mut connecting = !link.conn.open;
        if connecting {
            link.conn.open = true;
            link.conn.reading = true;
        }
        let mut writer = link.conn.writer.take();
        while !link.conn.outbox.is_empty() {
            let out = std::mem::take(&mut link.conn.outbox);
            let count = link.conn.next_seq - link.conn.written;
            let connect_after = link.connect_after;
            drop(link);
            let written = write_or_connect(connector, writer.take(), connect_after, &out, bounds);
            link = self.lock();
            if link.epoch != epoch {
                // The reader ended the connection meanwhile: what was just
                // written failed with it.
                break;
            }
            let backoff = connector.reconnect_backoff;
            writer = record_write(&mut link, written, out, count, &mut connecting, backoff);
            if writer.is_none() {
                break;
            }
        }
        if link.epoch == epoch {
            link.conn.writer = writer;
            link.conn.writing = false;
            if connecting {
                link.conn.reading = false;
            }
            // Sleepers want replies: a thread that is reading hands them
            // over. Otherwise what was written may be theirs to read now.
            if wake_reader {
                hand_off(&mut link, &connector.servers.pace);
            }
        }
        link
    }

    /// The reading role: reads one reply, and every other one already
    /// buffered whole, and hands each to its thread (or discards it), then
    /// lets go; over an unsplit connection, then writes what was queued
    /// meanwhile. The lock is not held during I/O. With a `pause`, a read
    /// of a split connection with no reply by then lets go with nothing
    /// read (the connection stays up).
    fn read_one<'a>(
        &'a self,
        mut link: Locked<'a>,
        connector: &Connector,
        bounds: Bounds,
        pause: Option<Instant>,
    ) -> Locked<'a> {
        let epoch = link.epoch;
        let unsplit = link.conn.unsplit;
        link.conn.reading = true;
        link.conn.writing |= unsplit;
        let mut reader = link.conn.reader.take();
        let mut writer = unsplit.then(|| link.conn.writer.take()).flatten();
        drop(link);
        let (received, more, waited) = receive(&mut reader, &mut writer, bounds.deadline, pause);
        link = self.lock();
        if link.epoch == epoch {
            if !matches!(received, Some(Err(_))) {
                // `None`: paused with nothing read (a wait of at least
                // `waited`).
                link.slow &= received.is_none();
                link.wait_us = link.wait_us - link.wait_us / 8 + waited / 8;
            }
            for next in received.into_iter().chain(more) {
                match next {
                    Ok(value) => store(&mut link, value, &connector.servers.pace),
                    Err(failure) => {
                        // The cause is recorded first: ending the socket
                        // makes a writer fail too, for no reason of its own.
                        end_epoch(&mut link, failure);
                        reader.iter().for_each(Reader::shutdown);
                    }
                }
            }
            if link.epoch == epoch {
                link.conn.reader = reader;
                link.conn.reading = false;
                if unsplit {
                    link.conn.writer = writer;
                    link.conn.writing = false;
                }
            }
        }
        if unsplit {
            link = self.write_out(link, connector, bounds, true);
        }
        link
    }
}

/// What a thread that wants a reply not stored yet does next.
enum Step {
    /// Write what is queued, its command among it.
    Write,
    /// Read the connection, pausing at `pause` if given.
    Read { pause: Option<Instant> },
    /// Sleep until woken, or until then at the latest.
    Sleep(Instant),
    /// No reply will come: why.
    Done(Result<Value, Failure>),
}

/// The reply to `ticket` if it is stored, or why none will come.
fn taken_now(link: &mut Link, ticket: Ticket) -> Option<Result<Value, Failure>> {
    match check(link, ticket) {
        Err(failure) => Some(Err(failure)),
        Ok(()) => take_stored(&mut link.conn, ticket.seq).map(Ok),
    }
}

/// Takes the stored reply to request `seq`, if any.
fn take_stored(conn: &mut Connection, seq: u64) -> Option<Value> {
    let i = conn.replies.iter().position(|(s, _)| *s == seq)?;
    Some(conn.replies.swap_remove(i).1)
}

/// What to do for `ticket`'s reply, not stored yet. Our command is
/// queued: a thread awake owes its write, or the next batch (before
/// `batch_until`) will carry it, until `flush_by`; unless nobody is awake
/// and no batch is awaited, or it is overdue: then we write it. Past the
/// deadline, the reply is given up.
fn next_step(
    link: &mut Link,
    pace: &Pace,
    ticket: Ticket,
    deadline: Instant,
    batch_until: Option<Instant>,
    flush_by: &mut Option<Instant>,
    now: Instant,
) -> Step {
    let late = now >= deadline;
    let mut queued_until = None;
    let conn = &mut link.conn;
    if ticket.seq >= conn.written && !conn.writing && !conn.outbox.is_empty() {
        if late {
            // Too late for a reply: it stays queued, abandoned.
            give_up(conn, ticket.seq);
            return Step::Done(Err(Failure::TimedOut));
        }
        let by = *flush_by.get_or_insert(now + FLUSH_GRACE);
        if (!pace.others_awake() && batch_until.is_none()) || now >= by {
            return Step::Write;
        }
        queued_until = Some(by);
    }
    if conn.next_read < conn.written && can_read(conn) && !(late && conn.live > 1) {
        return Step::Read {
            pause: queued_until,
        };
    }
    // Late, and other threads still want replies on this connection: a
    // read that timed out now would drop it for them too. Leave the
    // reading to them.
    if late {
        give_up(conn, ticket.seq);
        return Step::Done(Err(Failure::TimedOut));
    }
    Step::Sleep(queued_until.map_or(deadline, |by| by.min(deadline)))
}

/// What one write of the outbox did.
struct Written {
    writer: Option<Writer>,
    /// The new connection's reading half and known scripts, if it
    /// connected.
    opened: Option<(Option<Reader>, u8)>,
    sent: Result<(), Failure>,
}

/// Writes `out` with `writer`, or over a new connection if there is none
/// (unless backing off reconnecting). No lock is held.
fn write_or_connect(
    connector: &Connector,
    writer: Option<Writer>,
    connect_after: Option<Instant>,
    out: &[u8],
    bounds: Bounds,
) -> Written {
    let mut written = Written {
        writer,
        opened: None,
        sent: Ok(()),
    };
    if written.writer.is_none() {
        let (deadline, timeout) = (bounds.deadline, bounds.connect_timeout);
        match connector.connect_unless_backing_off(connect_after, deadline, timeout) {
            Ok(new) => {
                written.writer = Some(new.writer);
                written.opened = Some((new.reader, new.scripts));
            }
            Err(failure) => written.sent = Err(failure),
        }
    }
    if let (Some(w), Ok(())) = (&mut written.writer, &written.sent) {
        written.sent = w.send(out, bounds.deadline);
    }
    written
}

/// Records a write of `count` requests (`out`, whose buffer is kept for
/// the next batch): returns the writer to go on with, or none once the
/// write failed and ended the epoch.
fn record_write(
    link: &mut Link,
    written: Written,
    out: Vec<u8>,
    count: u64,
    connecting: &mut bool,
    reconnect_backoff: Duration,
) -> Option<Writer> {
    if written.opened.is_some() {
        link.connect_after = None;
    }
    match (written.sent, written.writer) {
        (Ok(()), Some(w)) => {
            if let Some((reader, scripts)) = written.opened {
                link.conn.unsplit = w.is_unsplit();
                link.conn.reader = reader;
                link.conn.scripts = scripts;
            }
            if std::mem::take(connecting) {
                // The handshake is over: replies may be read now, while
                // more is written.
                link.conn.reading = false;
                wake_one(link);
            }
            link.conn.written += count;
            if link.conn.outbox.is_empty() {
                // Keep the buffer's capacity for the next batch.
                link.conn.outbox = out;
                link.conn.outbox.clear();
            }
            Some(w)
        }
        (Err(Failure::ConnectTimedOut), _) => {
            link.connect_after = Instant::now().checked_add(reconnect_backoff);
            end_epoch(link, Failure::TimedOut);
            None
        }
        (Err(failure), w) => {
            // The cause is recorded first: ending the socket makes the
            // reader fail too, for no reason of its own.
            end_epoch(link, failure);
            w.iter().for_each(Writer::shutdown);
            None
        }
        (Ok(()), None) => None,
    }
}

/// A reply read, or why none could be.
type Received = Result<Value, Failure>;

/// Reads one reply (with the reading half, or over an unsplit connection
/// its writer), and every other one already buffered whole, parsed before
/// the lock is taken: the other threads need it meanwhile. Returns the
/// first (`None`: paused with nothing read), the others, and how long the
/// read blocked, in microseconds.
fn receive(
    reader: &mut Option<Reader>,
    writer: &mut Option<Writer>,
    deadline: Instant,
    pause: Option<Instant>,
) -> (Option<Received>, Vec<Received>, u64) {
    let began = Instant::now();
    let received = match (&mut *reader, writer) {
        (Some(r), _) => r
            .recv_until(deadline, pause.unwrap_or(deadline))
            .transpose(),
        (None, Some(w)) => Some(w.recv(deadline)),
        (None, None) => Some(Err(Failure::Error(NodeError::Io(
            "the connection has no reading half".to_string(),
        )))),
    };
    let waited = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
    // (No allocation unless a read brought several.)
    let mut more = Vec::new();
    if !matches!(received, Some(Err(_))) {
        while let Some(next) = reader.as_mut().and_then(Reader::recv_buffered) {
            let failed = next.is_err();
            more.push(next);
            if failed {
                break;
            }
        }
    }
    (received, more, waited)
}

/// Hands the next reply on the connection to its thread, waking it if it
/// sleeps (it holds the `pace` from then on), or discards it if its
/// thread stopped waiting.
fn store(link: &mut Link, value: Value, pace: &Pace) {
    let seq = link.conn.next_read;
    link.conn.next_read += 1;
    if link.conn.abandoned.pop_front().unwrap_or(false) {
        forget_scripts_if_lost(&mut link.conn, &value);
        return;
    }
    link.conn.live -= 1;
    link.conn.replies.push((seq, value));
    let ticket = Ticket {
        epoch: link.epoch,
        seq,
    };
    if let Some(sleeper) = link
        .sleepers
        .iter_mut()
        .find(|s| s.ticket == ticket && !s.stored)
    {
        sleeper.stored = true;
        let waiter = &sleeper.waiter;
        // The pace is held on its behalf under this node's lock, which the
        // waiter takes to delist before it looks whether it holds it.
        if waiter.stored.fetch_add(1, Ordering::AcqRel) + 1 >= waiter.need
            && waiter.wake(AWAKE_REPLY, &mut link.wakes)
        {
            pace.hold();
        }
    }
}

/// Replies are due and nobody reads them: unless a thread is awake (it
/// will read them when it polls, or, as the last to let go of the pace,
/// call this again), wakes a sleeper to take the reading role over. So a
/// reader lets go without waking anyone while others run, as an event
/// loop's poll serves whoever is ready.
fn hand_off(link: &mut Link, pace: &Pace) {
    if link.conn.next_read < link.conn.written && can_read(&link.conn) && !pace.others_awake() {
        wake_one(link);
    }
}

/// Wakes one sleeper that waits for a reply not read yet: it takes the
/// reading role over. Unless one that waits for a reply here is woken for
/// that already (on this node or another it waits on): it polls every
/// node it waits on, and reads this one, or, should its round be decided
/// first, hands this node off when it abandons its reply here. So one
/// wake-up serves every node whose replies one round awaits, not one per
/// node.
fn wake_one(link: &mut Link) {
    if link.sleepers.iter().any(|s| {
        s.ticket.epoch == link.epoch
            && !s.stored
            && s.waiter.woken.load(Ordering::Acquire) == AWAKE_OTHER
    }) {
        return;
    }
    let wakes = &mut link.wakes;
    let _ = (link.sleepers.iter()).any(|s| !s.stored && s.waiter.wake(AWAKE_OTHER, wakes));
}

/// Adds `waiter` as the sleeper of `ticket`.
fn enlist(link: &mut Link, ticket: Ticket, waiter: &Arc<Waiter>) {
    let waiter = Arc::clone(waiter);
    (link.sleepers).push(Sleeper {
        ticket,
        waiter,
        stored: false,
    });
}

/// Removes the sleeper of `ticket`.
fn delist(link: &mut Link, ticket: Ticket) {
    if let Some(i) = link.sleepers.iter().position(|s| s.ticket == ticket) {
        link.sleepers.swap_remove(i);
    }
}

/// Fails `ticket` if its epoch has ended.
fn check(link: &Link, ticket: Ticket) -> Result<(), Failure> {
    if link.epoch == ticket.epoch {
        return Ok(());
    }
    Err(match &link.ended {
        Some((epoch, failure)) if *epoch == ticket.epoch => failure.clone(),
        _ => Failure::Error(NodeError::Io(
            "the connection was dropped after an earlier failure".to_string(),
        )),
    })
}

/// Marks a request's reply as unwanted.
fn give_up(conn: &mut Connection, seq: u64) {
    conn.live -= 1;
    if let Some(flag) = seq
        .checked_sub(conn.next_read)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| conn.abandoned.get_mut(i))
    {
        *flag = true;
    }
}

/// An unread request was answered `NOSCRIPT`: the server lost our scripts
/// (`SCRIPT FLUSH`), so send them as `EVAL` from now on. The request itself
/// is not sent again: it could land behind a later command of ours and undo
/// it. (A release or extension left unread that way did not happen on that
/// node; the key keeps its TTL there. The quorum had already answered.)
fn forget_scripts_if_lost(conn: &mut Connection, reply: &Value) {
    if is_noscript(reply) {
        conn.scripts = 0;
    }
}

/// Drops the connection for everyone: every request on it fails.
fn end_epoch(link: &mut Link, failure: Failure) {
    link.conn.writer.iter().for_each(Writer::shutdown);
    link.conn.reader.iter().for_each(Reader::shutdown);
    link.conn = Connection::default();
    link.slow = failure == Failure::TimedOut;
    link.ended = Some((link.epoch, failure));
    link.epoch += 1;
    for sleeper in &link.sleepers {
        sleeper.waiter.wake(AWAKE_OTHER, &mut link.wakes);
    }
}

/// Whether the node's replies tend to come within half the
/// [`FLUSH_GRACE`]: a read of it blocks no longer than what batching may
/// cost anyway.
fn answers_quickly(link: &Link) -> bool {
    const QUICK_US: u64 = FLUSH_GRACE.as_micros() as u64 / 2;
    !link.slow && link.wait_us < QUICK_US
}

/// Whether a thread may take the reading role now.
fn can_read(conn: &Connection) -> bool {
    !conn.reading && (!conn.unsplit || !conn.writing)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread woken under a node's lock is unparked once the lock is let
    /// go, by the thread that woke it: not later (a sleeper would wait for
    /// its recheck), and not while the lock is held.
    #[test]
    fn a_thread_woken_under_the_lock_is_unparked_when_the_lock_is_let_go() {
        let shared = Shared::default();
        let waiter = Waiter::new(1);
        let mut link = shared.lock();
        assert!(waiter.wake(AWAKE_REPLY, &mut link.wakes));
        assert!(!waiter.wake(AWAKE_OTHER, &mut link.wakes), "woken once");
        assert_eq!(link.wakes.len(), 1, "its unpark waits for the lock");
        drop(link);
        assert!(shared.lock().wakes.is_empty(), "unparked on the way out");
        assert!(waiter.holds_pace(), "woken with its reply");
        // The unpark left this thread's token: a park returns at once.
        let parked = Instant::now();
        thread::park_timeout(Duration::from_secs(30));
        assert!(
            parked.elapsed() < Duration::from_secs(20),
            "the woken thread was never unparked"
        );
    }
}
