//! The shared connection of one node. Threads with a command queue it
//! here; the threads that want answers do the I/O.
//!
//! Commands go to the outbox. A writer empties it in one write, when
//! [`Pace`] says (see `Turn` in [`crate::node`]). Writing and reading are
//! separate roles, so a command never waits for a read. TLS cannot be
//! split: there the reader writes what was queued after its read.
//!
//! Replies come in order. Each is matched to its request by sequence number
//! and handed to its thread, or discarded if that stopped waiting. A round
//! sleeps once, on all its nodes (a [`Sleeper`]). The reader that stores
//! enough of its replies to decide it wakes it. A reader leaving with
//! replies due wakes a sleeper only if no thread is awake (see
//! [`hand_off`]).
//!
//! Any error or timeout ends the connection's *epoch*: it is dropped for
//! every thread, and every request on it fails. A reply is never matched
//! across epochs, so a late reply never answers another command.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};

/// A node's lock, held.
type Guard<'a> = MutexGuard<'a, Link>;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use redis::Value;

use super::pace::{Pace, BATCH_FROM, RECHECK};
use super::transport::{io_failure, Reader, Writer};
use super::Node;
use crate::error::Failure;
use crate::store::script::{is_noscript, Command};

/// Past this many unread replies, a round waits for its reply even once
/// decided. That drains the backlog, or ends a hung node's connection. So
/// a node always read last is read at least every this many rounds. It
/// learns soon what its unread replies said: a `NOSCRIPT` means its unread
/// releases did not happen. A merely slow node holds up one round in this
/// many.
const MAX_BACKLOG: u64 = 32;

/// When a submitted command is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// By the last thread to let go of the pace, a script by its SHA.
    Batched,
    /// Now, a script as `EVAL`.
    Now,
}

/// Who reads a node's replies after a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// This thread, next: nobody wakes to find the node taken.
    ReadHere,
    /// A sleeper, woken if needed (see [`hand_off`]).
    WakeReader,
}

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

/// A thread asleep until enough of its replies come on any of its nodes,
/// or a reader role frees up. The reader that stores the `need`th reply
/// wakes it.
pub(crate) struct Sleeper {
    thread: Thread,
    /// How many more of its replies must be stored to wake it.
    need: AtomicUsize,
    /// `AWAKE_NO`, `AWAKE_REPLY` or `AWAKE_OTHER`. Set once, by the waking
    /// thread, under the lock of the node where it woke it.
    woken: AtomicU8,
}

const AWAKE_NO: u8 = 0;
/// Woken with its replies stored: it holds the pace (see [`Pace`]).
const AWAKE_REPLY: u8 = 1;
/// Woken to take over a reader role, or because an epoch ended.
const AWAKE_OTHER: u8 = 2;

impl Sleeper {
    /// A waiter for this thread, woken once `need` (at least one) of its replies are stored.
    pub(crate) fn new(need: usize) -> Arc<Sleeper> {
        Arc::new(Sleeper {
            thread: thread::current(),
            need: AtomicUsize::new(need.max(1)),
            woken: AtomicU8::new(AWAKE_NO),
        })
    }

    pub(crate) fn woken(&self) -> bool {
        self.woken.load(Ordering::Acquire) != AWAKE_NO
    }

    /// Whether it was woken with its replies stored, so holds the pace.
    /// Read it once delisted from every node.
    pub(crate) fn holds_pace(&self) -> bool {
        self.woken.load(Ordering::Acquire) == AWAKE_REPLY
    }

    /// Marks it woken, unless it was already. Returns the thread to unpark.
    fn wake(&self, why: u8) -> Option<&Thread> {
        let woken = &self.woken;
        let cas = woken.compare_exchange(AWAKE_NO, why, Ordering::AcqRel, Ordering::Acquire);
        cas.ok().map(|_| &self.thread)
    }
}

/// Everything behind a node's mutex: this epoch's connection, and what outlives it.
#[derive(Default)]
pub(super) struct Link {
    /// Bumped whenever the connection is dropped.
    epoch: u64,
    /// The connection of this epoch (none open yet, if nobody holds or left a writer).
    conn: Connection,
    /// Why the last epoch ended.
    ended: Option<(u64, Failure)>,
    /// Threads asleep until their replies come (or a reader role frees), by
    /// request, in this epoch. Only [`store`], [`hand_off`] and
    /// [`end_epoch`] wake them: each needless wake-up costs a context switch
    /// and two syscalls.
    sleepers: Vec<(Ticket, Arc<Sleeper>)>,
    /// The last connection ended in a timeout, and no reply came since.
    slow: bool,
    /// No connect before this, after one timed out.
    connect_after: Option<Instant>,
    /// A moving average of how long a read of this node blocked, in µs.
    /// Rounds read the slowest nodes last.
    wait_us: u64,
}

/// One connection, from its connect to the end of its epoch: its halves,
/// who holds them, and its requests. Ending the epoch replaces it with
/// `Connection::default()` in one assignment: nothing carries over.
///
/// # Who holds the halves
///
/// A half lies here while no thread holds it. A thread takes it under the
/// lock with its role, does its I/O without the lock, and puts it back. If
/// the epoch ended meanwhile, it drops it instead.
///
/// | `writing` | `reading` | split (TCP, Unix socket) | unsplit (TLS) |
/// |---|---|---|---|
/// | no  | no  | both halves lie here (or none: not connected) | `writer` lies here (or not connected) |
/// | yes | no  | a thread writes with `writer` (or connects) | a thread writes with `writer` (or connects) |
/// | no  | yes | a thread reads with `reader` | (never) |
/// | yes | yes | one thread writes, another reads | one thread reads with `writer`, then writes what was queued meanwhile |
///
/// A thread may take the writer role while `writing` is false. It may take
/// the reader role when [`can_read`]. That is: `reading` is false, replies
/// are due (so the handshake is over), and an unsplit one is not `writing`.
/// Whoever ends the epoch shuts down the halves lying here. A thread
/// holding one finds out when its I/O fails.
#[derive(Default)]
struct Connection {
    /// The connection cannot be split (TLS): its writer also reads, so the
    /// reading role takes the writing role too.
    unsplit: bool,
    /// The connection's writing half, unless the writing thread holds it.
    writer: Option<Writer>,
    /// The reading half, unless the reader holds it (none when unsplit).
    reader: Option<Reader>,
    /// A thread is writing (it has taken `writer`, or is connecting).
    writing: bool,
    /// A thread is reading (it has taken `reader`, or on an unsplit connection `writer`).
    reading: bool,
    /// Bits of the scripts known to be cached on this connection's server.
    scripts: u8,
    /// Packed commands not written yet, in sequence order.
    outbox: Vec<u8>,
    next_seq: u64,
    /// Requests below this sequence number are on the wire.
    written: u64,
    next_read: u64,
    /// Replies read and not yet taken by their threads.
    replies: Vec<(u64, Value)>,
    /// One flag per unread request, from `next_read` on: whether its thread
    /// stopped waiting, so its reply is discarded. Never replayed: a command
    /// sent again could land behind a later one of ours and undo it.
    abandoned: VecDeque<bool>,
    /// Requests whose threads still want the reply (not read, not abandoned).
    live: u64,
}

impl Connection {
    /// Whether a connection is open in this epoch (or being opened).
    fn open(&self) -> bool {
        self.writing || self.writer.is_some()
    }
}

/// A node's shared connection: what its threads share, behind a mutex.
impl Node {
    fn lock(&self) -> Guard<'_> {
        crate::sync::lock(&self.link)
    }

    /// Queues `cmd` on the connection. With [`Write::Now`], a script goes
    /// as `EVAL` and the command is written now. That is for a reply nobody reads,
    /// and for the retry after a `NOSCRIPT`. Otherwise the last thread to
    /// let go of the [`Pace`] writes it (see [`flush`](Self::flush)). With
    /// no connection open it is written now too: a connect must not wait.
    /// "Now" means by this thread, connecting first if need be, or by a
    /// thread already writing.
    ///
    /// Returns the ticket, and whether the request is on the wire. That is
    /// read under the queueing's lock, so no other thread can have begun
    /// writing it (see [`written`](Self::written)).
    pub(crate) fn submit(
        &self,
        cmd: &Command,
        bounds: Bounds,
        write: Write,
    ) -> Result<(Ticket, bool), Failure> {
        let mut link = self.lock();
        let now = write == Write::Now;
        let scripts = if now { 0 } else { link.conn.scripts };
        link.conn.outbox.extend_from_slice(cmd.bytes_for(scripts));
        let ticket = Ticket {
            epoch: link.epoch,
            seq: link.conn.next_seq,
        };
        link.conn.next_seq += 1;
        link.conn.abandoned.push_back(false);
        link.conn.live += 1;
        if now || !link.conn.open() {
            link = self.write_out(link, bounds);
            check(&link, ticket)?;
        }
        Ok((ticket, ticket.seq < link.conn.written))
    }

    /// Whether request `ticket` is on the wire. False while it waits in the
    /// outbox, and for good if its connection ended first.
    pub(super) fn written(&self, ticket: Ticket) -> bool {
        let link = self.lock();
        link.epoch == ticket.epoch && ticket.seq < link.conn.written
    }

    /// Whether at least [`BATCH_FROM`] awaited requests are on the wire. Each
    /// of their threads wakes once its replies are read, and writes what is
    /// queued by then. False unless the node is quick (under half a
    /// [`RECHECK`] on average) and its connection splits. Otherwise a
    /// command queued for them would wait a whole round trip. (An unsplit
    /// read cannot pause for our command.)
    pub(super) fn carries_batch(&self) -> bool {
        let link = self.lock();
        let conn = &link.conn;
        let quick = !link.slow && link.wait_us < RECHECK.as_micros() as u64 / 2;
        let queued = conn.next_seq - conn.written;
        quick && !conn.unsplit && conn.live.saturating_sub(queued) >= BATCH_FROM
    }

    /// Writes what is queued, unless another thread is writing: that one
    /// writes it before it lets go. Then, as `after` says, a reader.
    pub(super) fn flush(&self, bounds: Bounds, after: After) {
        let link = self.write_out(self.lock(), bounds);
        if after == After::WakeReader {
            hand_off(link, self.pace());
        }
    }

    /// Takes the reply to `ticket`, reading it (and what precedes it) if no
    /// other thread does I/O. `None` if that needs a sleep: another thread
    /// does the I/O, or an awake thread owes the write. That one writes as
    /// it lets go of the [`Pace`]. Past the deadline the reply is given up,
    /// unless it is the only one owed and nobody reads it.
    ///
    /// Until `batch_until`, a queued command waits for the next batch, even
    /// with nobody awake. The threads the replies on the wire wake write
    /// it. A read pauses then. Past it, `None`: the round writes its queued
    /// commands before a read may block.
    pub(super) fn take(
        &self,
        ticket: Ticket,
        bounds: Bounds,
        batch_until: Option<Instant>,
    ) -> Option<Result<Value, Failure>> {
        let pace = self.pace();
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
            // Late, with our command unsent or others wanting replies here:
            // a timed-out read would drop the connection for them too.
            if Instant::now() >= bounds.deadline && (queued || !readable || conn.live > 1) {
                give_up(conn, ticket.seq);
                break Some(Err(Failure::TimedOut));
            }
            if queued && !pace.others_awake() && batch_until.is_none() {
                link = self.write_out(link, bounds);
            } else if readable {
                link = self.read_one(link, bounds, batch_until);
            } else {
                break None;
            }
        };
        hand_off(link, pace);
        taken
    }

    /// Enlists `waiter` for the reply to `ticket`. The reader that stores it
    /// counts it, and wakes the waiter once it has its `need`. Returns false,
    /// enlisting nothing, if the waiter need not sleep. That is when the
    /// reply is stored, the reader role is free with replies due, or the
    /// epoch ended. Each enlisted ticket must be [`delist`](Self::delist)ed
    /// once it wakes.
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
        self.lock().sleepers.retain(|(t, _)| *t != ticket);
    }

    /// Whether writing now means connecting first, which may block up to the
    /// connect timeout: no connection, and no reconnect backoff.
    pub(crate) fn will_connect(&self) -> bool {
        let link = self.lock();
        !link.conn.open() && link.connect_after.is_none_or(|at| at <= Instant::now())
    }

    /// How late this node tends to answer: a power-of-two bucket of its
    /// average read block. The most after a timed-out connection. Rounds
    /// read nodes in this order, so a quorum need not wait for the slow.
    pub(crate) fn lateness(&self) -> u32 {
        match self.lock() {
            link if link.slow => u32::MAX,
            link => link.wait_us.max(1).ilog2(),
        }
    }

    /// Whether so many replies are unread that the next round should wait
    /// for its reply, not leave it.
    pub(super) fn backlogged(&self, ticket: Ticket) -> bool {
        let link = self.lock();
        link.epoch == ticket.epoch && ticket.seq >= link.conn.next_read + MAX_BACKLOG
    }

    /// The reply to `ticket` is no longer wanted: discard it when it comes.
    /// The thread will not read the node, so a sleeper may be woken to (see
    /// [`hand_off`]).
    pub(super) fn abandon(&self, ticket: Ticket) {
        let mut link = self.lock();
        if link.epoch != ticket.epoch {
            return;
        }
        match take_stored(&mut link.conn, ticket.seq) {
            Some(reply) => forget_scripts_if_lost(&mut link.conn, &reply),
            None => give_up(&mut link.conn, ticket.seq),
        }
        hand_off(link, self.pace());
    }

    /// Records what `reply` says of script `bit` on `ticket`'s server. A
    /// script that ran is cached there; `NOSCRIPT` says it is not. Returns
    /// whether it said `NOSCRIPT`.
    pub(super) fn note_script(&self, ticket: Ticket, bit: u8, reply: &Value) -> bool {
        let lost = is_noscript(reply);
        let ran = !matches!(reply, Value::ServerError(_));
        let mut link = self.lock();
        if link.epoch == ticket.epoch && (lost || ran) {
            link.conn.scripts = (link.conn.scripts & !bit) | if ran { bit } else { 0 };
        }
        lost
    }

    /// The writer role: writes the outbox until empty, connecting first if
    /// need be, then lets go. If another thread is writing, that one writes
    /// the outbox before it lets go. No lock during I/O. After a connect,
    /// wakes a sleeper to read what was written (see [`hand_off`]).
    /// Otherwise the caller hands off.
    fn write_out<'a>(&'a self, mut link: Guard<'a>, bounds: Bounds) -> Guard<'a> {
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
            let opened = self.connect_unless_backing_off(after, bounds);
            link = self.lock();
            match opened {
                // (Nobody else ends an epoch with nothing written yet.)
                _ if link.epoch != epoch => return link,
                Ok((new, reader, scripts)) => {
                    link.connect_after = None;
                    link.conn.unsplit = reader.is_none();
                    (link.conn.reader, link.conn.scripts) = (reader, scripts);
                    writer = Some(new);
                }
                Err(Failure::ConnectTimedOut) => {
                    link.connect_after = Instant::now().checked_add(self.reconnect_backoff);
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
                // The reader ended the connection meanwhile: what was just written failed with it.
                return link;
            }
            if let Err(failure) = sent {
                // Record the cause first: ending the socket fails the reader
                // too, for no reason of its own.
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
        (link.conn.writer, link.conn.writing) = (writer, false);
        if connecting {
            hand_off(link, self.pace());
            return self.lock();
        }
        link
    }

    /// The reader role. Reads one reply, and each other one buffered whole,
    /// and hands each to its thread or discards it. It parses before
    /// retaking the lock, which others need meanwhile. Then it lets go; an
    /// unsplit connection then writes what was queued. No lock during I/O.
    /// With a `pause`, a split read with no reply by then lets go with
    /// nothing read. The connection stays up.
    fn read_one<'a>(
        &'a self,
        mut link: Guard<'a>,
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
        let (began, pause) = (Instant::now(), pause.unwrap_or(bounds.deadline));
        // `None`: paused with nothing read.
        let first = match (&mut reader, &mut writer) {
            (Some(r), _) => r.recv_until(bounds.deadline, pause).transpose(),
            (None, Some(w)) => Some(w.recv(bounds.deadline)),
            (None, None) => Some(Err(io_failure("the connection has no reading half"))),
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
                    Ok(value) => woken.extend(store(&mut link, value, self.pace())),
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
            link = self.write_out(link, bounds);
        }
        link
    }
}

/// Takes the stored reply to request `seq`, if any.
fn take_stored(conn: &mut Connection, seq: u64) -> Option<Value> {
    let i = conn.replies.iter().position(|(s, _)| *s == seq)?;
    Some(conn.replies.swap_remove(i).1)
}

/// Hands the next reply to its thread, or discards it if that stopped
/// waiting. It counts for the thread's sleeper, which wakes once it has its
/// replies and then holds the `pace`. Returns the woken thread, to unpark
/// once the lock is let go.
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
    if waiter.need.fetch_sub(1, Ordering::AcqRel) > 1 {
        return None;
    }
    // Held on its behalf under this node's lock, which the waiter takes to
    // delist before it checks.
    let thread = waiter.wake(AWAKE_REPLY)?.clone();
    pace.hold();
    Some(thread)
}

/// Replies are due and nobody reads them: wakes a sleeper to take over the
/// reader role. Every sleeper waits for unread replies.
///
/// No one is woken while a thread is awake. That one reads when it polls,
/// or calls this again as the last to let go of the pace. So a reader lets
/// go without waking anyone while others run, like an event loop's poll.
/// Nor is one woken if a sleeper already was, here or on another node it
/// waits on. That one polls all its nodes and reads this one. If its round
/// is decided first, it hands this node off as it abandons its reply. So
/// one wake-up serves all of a round's nodes. The lock is let go before the
/// unpark, as after a read.
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
        _ => io_failure("the connection was dropped after an earlier failure"),
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
/// (`SCRIPT FLUSH`), so send them as `EVAL` from now on. The request is not
/// sent again (see `abandoned`). A release or extension lost so did not
/// happen there, and the key keeps its TTL; the quorum had answered already.
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
