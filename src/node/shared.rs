//! The shared connection of one node: every thread that has a command for
//! the node queues it here, and the threads that want answers do the I/O.
//!
//! Commands are queued on the connection's outbox, and whoever writes
//! empties it in one write (when that happens is [`Pace`]'s business: see
//! `Turn` in [`crate::node`]). Writing and reading are separate roles: a
//! command never waits for a read to return (except over TLS, whose
//! connection cannot be split: there its reader writes what was queued
//! once its read returns). Replies come back in order: each is matched to
//! its request by sequence number and handed to the thread that asked (or
//! discarded, if that thread stopped waiting). A reader hands out every
//! reply one read brought. A round sleeps once, on all its nodes at a time
//! (a [`Sleeper`]): readers count its replies, and the one that stores as
//! many as could decide the round wakes it. A reader that lets the reading
//! role go with replies due wakes a sleeper to read on only when no thread
//! is awake to poll the node, and one sleeper woken to read serves every
//! node it waits on (see [`hand_off`]).
//!
//! Any error or timeout on the connection ends its *epoch*: the connection is
//! dropped for every thread that shared it, and every request still on it
//! fails. A reply is never matched across epochs, so a late reply can never
//! be taken for the answer to another command.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A node's lock, held.
type Guard<'a> = MutexGuard<'a, Link>;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use redis::Value;

use super::connect::Connector;
use super::pace::{Pace, BATCH_FROM, RECHECK};
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

/// A thread asleep until enough of its replies come, on any of the nodes
/// it waits on (a round waits on all its nodes at once), or until the
/// reading role of one of them is free: one wake-up per round, not one per
/// node. Readers count its replies; the one that stores the `need`th
/// wakes it.
pub(crate) struct Sleeper {
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

impl Sleeper {
    /// A waiter for this thread, woken once `need` of its replies are
    /// stored (at least one).
    pub(crate) fn new(need: usize) -> Arc<Sleeper> {
        Arc::new(Sleeper {
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

    /// Marks it woken, unless it was woken already: then returns the
    /// thread to unpark.
    fn wake(&self, why: u8) -> Option<&Thread> {
        let (no, order) = (AWAKE_NO, Ordering::AcqRel);
        let cas = self
            .woken
            .compare_exchange(no, why, order, Ordering::Acquire);
        cas.ok().map(|_| &self.thread)
    }
}

/// Everything behind a node's mutex: the connection of the current epoch,
/// and what outlives it.
#[derive(Default)]
struct Link {
    /// Bumped whenever the connection is dropped.
    epoch: u64,
    /// The connection of this epoch (none open yet, if nobody holds or
    /// left a writer).
    conn: Connection,
    /// Why the last epoch ended.
    ended: Option<(u64, Failure)>,
    /// The threads asleep until their replies come (or the reading role is
    /// free), by request, in this epoch: a thread that stores one of these
    /// replies counts it for that sleeper (and drops it from the list); one
    /// that lets the reading role go while replies are due wakes one
    /// sleeper to take it over; the end of an epoch wakes all. Nobody else
    /// is woken: every thread woken for nothing costs a context switch and
    /// two syscalls.
    sleepers: Vec<(Ticket, Arc<Sleeper>)>,
    /// The last connection ended in a timeout, and no reply came since.
    slow: bool,
    /// No connect before this, after one timed out.
    connect_after: Option<Instant>,
    /// A moving average of how long a read of this node blocked, in
    /// microseconds: rounds read the nodes that keep them waiting last.
    wait_us: u64,
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
/// | no  | no  | both halves lie here (or none: not connected) | `writer` lies here (or not connected) |
/// | yes | no  | a thread writes with `writer` (or connects) | a thread writes with `writer` (or connects) |
/// | no  | yes | a thread reads with `reader` | (never) |
/// | yes | yes | one thread writes, another reads | one thread reads with `writer`, then writes what was queued meanwhile |
///
/// A thread may take the writing role while `writing` is false, and the
/// reading role when [`can_read`]: `reading` is false, replies are due (so
/// the handshake is over) and, on an unsplit connection, `writing` is
/// false too. Whoever ends the epoch shuts down the halves that lie here; a
/// thread that holds one finds out when its I/O fails.
#[derive(Default)]
struct Connection {
    /// The connection cannot be split (TLS): its writer also reads, so the
    /// reading role takes the writing role too.
    unsplit: bool,
    /// The connection's writing half, unless the writing thread holds it.
    writer: Option<Writer>,
    /// The reading half, unless the reading thread holds it (none for an
    /// unsplit connection).
    reader: Option<Reader>,
    /// A thread is writing (it has taken `writer`, or is connecting).
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

impl Connection {
    /// Whether a connection is open in this epoch (or being opened).
    fn open(&self) -> bool {
        self.writing || self.writer.is_some()
    }
}

impl Shared {
    fn lock(&self) -> Guard<'_> {
        self.link.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `cmd` on the connection. With `eval` (for a request whose
    /// reply nobody will read, and for the retry after a `NOSCRIPT`), a
    /// script goes as `EVAL` and the command is written now; otherwise it
    /// is left for whoever lets go of the client's [`Pace`] last (see
    /// [`flush`](Self::flush)), unless the connection is not open yet: a
    /// connect must not wait. Written now means: by this thread, or, if
    /// another thread is writing, by that thread before it lets go; and
    /// connected first if there is no connection.
    ///
    /// Returns the request's ticket, and whether it is on the wire: asked
    /// with the lock still held from the queueing, so that no other thread
    /// can have begun writing it in between (see [`written`](Self::written)).
    pub(super) fn submit(
        &self,
        connector: &Connector,
        cmd: &Command,
        bounds: Bounds,
        eval: bool,
    ) -> Result<(Ticket, bool), Failure> {
        let mut link = self.lock();
        let scripts = if eval { 0 } else { link.conn.scripts };
        link.conn.outbox.extend_from_slice(cmd.bytes_for(scripts));
        let ticket = Ticket {
            epoch: link.epoch,
            seq: link.conn.next_seq,
        };
        link.conn.next_seq += 1;
        link.conn.abandoned.push_back(false);
        link.conn.live += 1;
        if eval || !link.conn.open() {
            link = self.write_out(link, connector, bounds);
            check(&link, ticket)?;
        }
        Ok((ticket, ticket.seq < link.conn.written))
    }

    /// Whether the request `ticket` is on the wire: false while it waits in
    /// the outbox (another thread writing, or connecting), and for good once
    /// its connection ended before it was written.
    pub(super) fn written(&self, ticket: Ticket) -> bool {
        let link = self.lock();
        link.epoch == ticket.epoch && ticket.seq < link.conn.written
    }

    /// Whether at least [`BATCH_FROM`] requests whose threads await their
    /// replies are on the wire: each of those threads will be woken once
    /// its replies are read, and write what is queued by then. Never
    /// unless the node answers quickly (within half a [`RECHECK`], on
    /// average) and its connection splits (a read of an unsplit one cannot
    /// pause for our command): a command queued to wait for them would
    /// wait a whole round trip.
    pub(super) fn carries_batch(&self) -> bool {
        let link = self.lock();
        let conn = &link.conn;
        let quick = !link.slow && link.wait_us < RECHECK.as_micros() as u64 / 2;
        let queued = conn.next_seq - conn.written;
        quick && !conn.unsplit && conn.live.saturating_sub(queued) >= BATCH_FROM
    }

    /// Writes what is queued, unless another thread is writing (which
    /// writes it before it lets go). With `wake_reader`, then wakes a
    /// sleeper to read if replies are due, nobody reads them and no thread
    /// is awake (see [`hand_off`]); a thread that goes on to read the node
    /// itself passes false, so that nobody is woken to find the reading
    /// role taken.
    pub(super) fn flush(&self, connector: &Connector, bounds: Bounds, wake_reader: bool) {
        let link = self.write_out(self.lock(), connector, bounds);
        if wake_reader {
            hand_off(link, &connector.servers.pace);
        }
    }

    /// Takes the reply to `ticket`, reading it (and whatever comes before
    /// it) when no other thread is doing I/O; `None` when it cannot be had
    /// without sleeping: another thread does the I/O, or a thread awake on
    /// the client's [`Pace`] owes the write of the command (it writes it
    /// when it lets go). Past the deadline, the reply is given up, unless
    /// it is the only one the connection owes and nobody reads it.
    ///
    /// Until `batch_until`, a command still queued waits for the next
    /// batch even while nobody is awake (the threads woken by the replies
    /// on the wire write it), and a read pauses then; past it, `None`, so
    /// that the round writes its queued commands before a read may block.
    pub(super) fn take(
        &self,
        connector: &Connector,
        ticket: Ticket,
        bounds: Bounds,
        batch_until: Option<Instant>,
    ) -> Option<Result<Value, Failure>> {
        let pace = &connector.servers.pace;
        let mut link = self.lock();
        let taken = loop {
            if let Err(failure) = check(&link, ticket) {
                break Some(Err(failure));
            }
            if let Some(value) = take_stored(&mut link.conn, ticket.seq) {
                break Some(Ok(value));
            }
            if batch_until.is_some_and(|by| Instant::now() >= by) {
                break None;
            }
            let conn = &mut link.conn;
            let queued = ticket.seq >= conn.written && !conn.writing;
            let readable = can_read(conn);
            // Late, and our command not sent, or other threads still want
            // replies here: a read that timed out now would drop the
            // connection for them too. Leave the reading to them.
            if Instant::now() >= bounds.deadline && (queued || !readable || conn.live > 1) {
                give_up(conn, ticket.seq);
                break Some(Err(Failure::TimedOut));
            }
            if queued && !pace.others_awake() && batch_until.is_none() {
                link = self.write_out(link, connector, bounds);
            } else if readable {
                link = self.read_one(link, connector, bounds, batch_until);
            } else {
                break None;
            }
        };
        hand_off(link, pace);
        taken
    }

    /// Enlists `waiter` for the reply to `ticket`: the reader that stores
    /// it counts it, and wakes the waiter once it has its `need`. Returns
    /// false, enlisting nothing, if the waiter need not sleep: the reply is
    /// stored, the reading role is free with replies due, or the epoch
    /// ended. Every enlisted ticket must be [`delist`](Self::delist)ed once
    /// the waiter wakes.
    pub(super) fn enlist(&self, ticket: Ticket, waiter: &Arc<Sleeper>) -> bool {
        let mut link = self.lock();
        let conn = &link.conn;
        if link.epoch != ticket.epoch
            || conn.replies.iter().any(|(seq, _)| *seq == ticket.seq)
            || can_read(conn)
        {
            return false;
        }
        link.sleepers.push((ticket, Arc::clone(waiter)));
        true
    }

    /// Removes the waiter enlisted for `ticket`, if still there.
    pub(super) fn delist(&self, ticket: Ticket) {
        let mut link = self.lock();
        if let Some(i) = link.sleepers.iter().position(|(t, _)| *t == ticket) {
            link.sleepers.swap_remove(i);
        }
    }

    /// Whether writing to the node now means connecting first (it has no
    /// connection, and is not backing off reconnecting): that may block up
    /// to the connect timeout.
    pub(crate) fn will_connect(&self) -> bool {
        let link = self.lock();
        !link.conn.open() && link.connect_after.is_none_or(|at| at <= Instant::now())
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
        hand_off(link, pace);
    }

    /// Records what `reply` says about whether the server of `ticket`'s
    /// connection has the script `bit`: a script that ran is cached there,
    /// a `NOSCRIPT` says it is not. Returns whether it said `NOSCRIPT`.
    pub(super) fn note_script(&self, ticket: Ticket, bit: u8, reply: &Value) -> bool {
        let lost = is_noscript(reply);
        let ran = !matches!(reply, Value::ServerError(_));
        let mut link = self.lock();
        if link.epoch == ticket.epoch && (lost || ran) {
            link.conn.scripts = (link.conn.scripts & !bit) | if ran { bit } else { 0 };
        }
        lost
    }

    /// The writing role: writes the outbox until it is empty (connecting
    /// first if there is no connection), then lets go. If another thread is
    /// writing, it writes the outbox before it lets go. The lock is not held
    /// during I/O. After a connect, wakes a sleeper to read what was
    /// written (see [`hand_off`]); otherwise the caller hands off.
    fn write_out<'a>(
        &'a self,
        mut link: Guard<'a>,
        connector: &Connector,
        bounds: Bounds,
    ) -> Guard<'a> {
        if link.conn.writing || link.conn.outbox.is_empty() {
            return link;
        }
        let epoch = link.epoch;
        link.conn.writing = true;
        let mut writer = link.conn.writer.take();
        let connecting = writer.is_none();
        if connecting {
            let after = link.connect_after;
            drop(link);
            let (deadline, timeout) = (bounds.deadline, bounds.connect_timeout);
            let opened = connector.connect_unless_backing_off(after, deadline, timeout);
            link = self.lock();
            match opened {
                // (Nobody else ends an epoch with nothing written yet.)
                _ if link.epoch != epoch => return link,
                Ok(new) => {
                    link.connect_after = None;
                    link.conn.unsplit = new.writer.is_unsplit();
                    (link.conn.reader, link.conn.scripts) = (new.reader, new.scripts);
                    writer = Some(new.writer);
                }
                Err(Failure::ConnectTimedOut) => {
                    let backoff = connector.reconnect_backoff;
                    link.connect_after = Instant::now().checked_add(backoff);
                    end_epoch(&mut link, Failure::TimedOut);
                    return link;
                }
                Err(failure) => {
                    end_epoch(&mut link, failure);
                    return link;
                }
            }
        }
        while let Some(w) = writer.as_mut().filter(|_| !link.conn.outbox.is_empty()) {
            let out = std::mem::take(&mut link.conn.outbox);
            let count = link.conn.next_seq - link.conn.written;
            drop(link);
            let sent = w.send(&out, bounds.deadline);
            link = self.lock();
            if link.epoch != epoch {
                // The reader ended the connection meanwhile: what was just
                // written failed with it.
                return link;
            }
            if let Err(failure) = sent {
                // The cause is recorded first: ending the socket makes the
                // reader fail too, for no reason of its own.
                link.conn.writer = writer;
                end_epoch(&mut link, failure);
                return link;
            }
            link.conn.written += count;
            if link.conn.outbox.is_empty() {
                // Keep the buffer's capacity for the next batch.
                link.conn.outbox = out;
                link.conn.outbox.clear();
            }
        }
        link.conn.writer = writer;
        link.conn.writing = false;
        if connecting {
            hand_off(link, &connector.servers.pace);
            return self.lock();
        }
        link
    }

    /// The reading role: reads one reply, and every other one already
    /// buffered whole (parsed before the lock is taken again: the other
    /// threads need it meanwhile), and hands each to its thread (or
    /// discards it), then lets go; over an unsplit connection, then writes
    /// what was queued meanwhile. The lock is not held during I/O. With a
    /// `pause`, a read of a split connection with no reply by then lets go
    /// with nothing read (the connection stays up).
    fn read_one<'a>(
        &'a self,
        mut link: Guard<'a>,
        connector: &Connector,
        bounds: Bounds,
        pause: Option<Instant>,
    ) -> Guard<'a> {
        let epoch = link.epoch;
        let unsplit = link.conn.unsplit;
        link.conn.reading = true;
        link.conn.writing |= unsplit;
        let mut reader = link.conn.reader.take();
        let mut writer = unsplit.then(|| link.conn.writer.take()).flatten();
        drop(link);
        let began = Instant::now();
        // `None`: paused with nothing read.
        let first = match (&mut reader, &mut writer) {
            (Some(r), _) => {
                (r.recv_until(bounds.deadline, pause.unwrap_or(bounds.deadline))).transpose()
            }
            (None, Some(w)) => Some(w.recv(bounds.deadline)),
            (None, None) => Some(Err(Failure::Error(NodeError::Io(
                "the connection has no reading half".to_string(),
            )))),
        };
        let read = matches!(first, Some(Ok(_)));
        let waited = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
        // (No allocation unless a read brought several.)
        let mut more = Vec::new();
        while let Some(next) = reader
            .as_mut()
            .filter(|_| read)
            .and_then(Reader::recv_buffered)
        {
            let failed = next.is_err();
            more.push(next);
            if failed {
                break;
            }
        }
        link = self.lock();
        if link.epoch == epoch {
            if !matches!(first, Some(Err(_))) {
                link.slow &= !read;
                link.wait_us = link.wait_us - link.wait_us / 8 + waited / 8;
            }
            (link.conn.reader, link.conn.reading) = (reader, false);
            if unsplit {
                (link.conn.writer, link.conn.writing) = (writer, false);
            }
            let mut woken = Vec::new();
            for next in first.into_iter().chain(more) {
                match next {
                    Ok(value) => woken.extend(store(&mut link, value, &connector.servers.pace)),
                    Err(failure) => {
                        end_epoch(&mut link, failure);
                        break;
                    }
                }
            }
            if !woken.is_empty() {
                // Unparked with the lock let go: an unpark is a syscall, and
                // the woken threads need the lock first thing.
                drop(link);
                woken.iter().for_each(Thread::unpark);
                link = self.lock();
            }
        }
        if unsplit {
            link = self.write_out(link, connector, bounds);
        }
        link
    }
}

/// Takes the stored reply to request `seq`, if any.
fn take_stored(conn: &mut Connection, seq: u64) -> Option<Value> {
    let i = conn.replies.iter().position(|(s, _)| *s == seq)?;
    Some(conn.replies.swap_remove(i).1)
}

/// Hands the next reply on the connection to its thread, counting it for
/// its sleeper and waking that once it has its replies (it holds the
/// `pace` from then on: returns its thread, to unpark once the lock is let
/// go), or discards it if its thread stopped waiting.
fn store(link: &mut Link, value: Value, pace: &Pace) -> Option<Thread> {
    let seq = link.conn.next_read;
    link.conn.next_read += 1;
    if link.conn.abandoned.pop_front().unwrap_or(false) {
        forget_scripts_if_lost(&mut link.conn, &value);
        return None;
    }
    link.conn.live -= 1;
    link.conn.replies.push((seq, value));
    let i = link.sleepers.iter().position(|(t, _)| t.seq == seq)?;
    let (_, waiter) = link.sleepers.swap_remove(i);
    if waiter.stored.fetch_add(1, Ordering::AcqRel) + 1 < waiter.need {
        return None;
    }
    // The pace is held on its behalf under this node's lock, which the
    // waiter takes to delist before it looks whether it holds it.
    let thread = waiter.wake(AWAKE_REPLY)?.clone();
    pace.hold();
    Some(thread)
}

/// Replies are due and nobody reads them: unless a thread is awake (it
/// will read them when it polls, or, as the last to let go of the pace,
/// call this again), wakes a sleeper (all of them wait for replies not read
/// yet) to take the reading role over. So a reader lets go without waking
/// anyone while others run, as an event loop's poll serves whoever is
/// ready. Nor is one woken if one is woken for that already (on this node
/// or another it waits on): it polls every node it waits on, and reads
/// this one, or, should its round be decided first, hands this node off
/// when it abandons its reply here. So one wake-up serves every node whose
/// replies one round awaits, not one per node. The lock is let go before
/// the woken thread is unparked, as after a read.
fn hand_off(link: Guard<'_>, pace: &Pace) {
    let woken = |w: &Sleeper| w.woken.load(Ordering::Acquire) == AWAKE_OTHER;
    if !can_read(&link.conn) || pace.others_awake() || link.sleepers.iter().any(|(_, w)| woken(w)) {
        return;
    }
    let woken = link
        .sleepers
        .iter()
        .find_map(|(_, w)| w.wake(AWAKE_OTHER))
        .cloned();
    // Unparked with the lock let go: the woken thread needs it first thing.
    drop(link);
    woken.iter().for_each(Thread::unpark);
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

/// Drops the connection for everyone: every request on it fails, and every
/// sleeper wakes to find out.
fn end_epoch(link: &mut Link, failure: Failure) {
    link.conn.writer.iter().for_each(Writer::shutdown);
    link.conn.reader.iter().for_each(Reader::shutdown);
    link.conn = Connection::default();
    link.slow = failure == Failure::TimedOut;
    link.ended = Some((link.epoch, failure));
    link.epoch += 1;
    for (_, waiter) in std::mem::take(&mut link.sleepers) {
        waiter.wake(AWAKE_OTHER).iter().for_each(|t| t.unpark());
    }
}

/// Whether a thread may take the reading role now: replies are due and
/// nobody reads them (nor, on an unsplit connection, writes).
fn can_read(conn: &Connection) -> bool {
    conn.next_read < conn.written && !conn.reading && (!conn.unsplit || !conn.writing)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter is woken once, by the first thread that wakes it, which
    /// gets its thread to unpark and says why it woke it.
    #[test]
    fn a_waiter_is_woken_once_and_says_why() {
        let waiter = Sleeper::new(1);
        assert!(!waiter.woken());
        let thread = waiter.wake(AWAKE_REPLY).expect("not woken before");
        assert_eq!(thread.id(), thread::current().id());
        assert!(waiter.wake(AWAKE_OTHER).is_none(), "woken once");
        assert!(
            waiter.woken() && waiter.holds_pace(),
            "woken with its reply"
        );
    }
}
