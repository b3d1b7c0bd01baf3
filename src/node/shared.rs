//! The shared connection of one node: every thread that has a command for
//! the node queues it here, and the threads that want answers do the I/O.
//!
//! Threads batch their commands on the shared connection. A thread that finds
//! another writing leaves its packed command in the node's outbox; the writer
//! writes the whole outbox, in one write, before it lets go. Writing and
//! reading are separate roles: a command never waits for a read to return
//! (except over TLS, whose connection cannot be split: there its reader
//! writes what was queued once its read returns). Replies come back in
//! order: each is matched to its request by sequence number and handed to
//! the thread that asked (or discarded, if that thread stopped waiting).
//!
//! Any error or timeout on the connection ends its *epoch*: the connection is
//! dropped for every thread that shared it, and every request still on it
//! fails. A reply is never matched across epochs, so a late reply can never
//! be taken for the answer to another command.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::Value;

use super::connect::Connector;
use super::transport::{Reader, Writer};
use crate::error::{Failure, NodeError};
use crate::script::{is_noscript, Command};

/// Past this many unread replies on a connection, a round waits for its
/// reply even after the outcome is decided, draining the backlog (or, on a
/// hung node, ending the connection). A reply is a few bytes, so this costs
/// little memory, and a node that is merely slow seldom holds up a round.
const MAX_BACKLOG: u64 = 1024;

/// A request on a node's connection: which epoch, and its place in line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    epoch: u64,
    seq: u64,
}

/// A node's shared connection: its state behind a mutex, and the condition
/// variable its sleepers wait on.
pub(super) struct Shared {
    state: Mutex<State>,
    /// Signalled when a reply a sleeper waits for is stored, when the
    /// reading role is let go with replies due, when a write lands while
    /// nobody reads, or when the epoch ends.
    changed: Condvar,
}

/// The shared connection and everything queued on it.
struct State {
    /// A connection is open in this epoch (or being opened).
    open: bool,
    /// The connection cannot be split (TLS): its writer also reads, so the
    /// reading role takes the writing role too.
    whole: bool,
    /// The connection's writing half, unless the writing thread holds it.
    writer: Option<Writer>,
    /// The reading half, unless the reading thread holds it (none for a
    /// whole connection).
    reader: Option<Reader>,
    /// A thread is writing (it has taken `writer`).
    writing: bool,
    /// A thread is reading (it has taken `reader`, or for a whole
    /// connection `writer`).
    reading: bool,
    /// Bumped whenever the connection is dropped.
    epoch: u64,
    /// Why the last epoch ended.
    ended: Option<(u64, Failure)>,
    /// Bits of the scripts known to be cached on this connection's server.
    scripts: u8,
    /// Packed commands not written yet, in sequence order.
    outbox: Vec<u8>,
    /// Sequence number of the next request, in this epoch.
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
    /// The requests whose threads are blocked waiting for their replies
    /// (or for the reading role): a thread that stores one of these
    /// replies, or lets the reading role go while replies are due, wakes
    /// them. Nobody else is woken: a notify is a syscall, and every thread
    /// woken for nothing costs two more.
    sleepers: Vec<u64>,
    /// The last connection ended in a timeout, and no reply came since.
    slow: bool,
    /// No connect before this, after one timed out.
    connect_after: Option<Instant>,
    /// A moving average of how long a read of this node blocked, in
    /// microseconds: rounds read the nodes that keep them waiting last.
    wait_us: u64,
    /// Requests whose threads still want the reply (not read, not
    /// abandoned).
    live: u64,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            state: Mutex::new(State {
                open: false,
                whole: false,
                writer: None,
                reader: None,
                writing: false,
                reading: false,
                epoch: 0,
                ended: None,
                scripts: 0,
                outbox: Vec::new(),
                next_seq: 0,
                written: 0,
                next_read: 0,
                replies: Vec::new(),
                abandoned: VecDeque::new(),
                sleepers: Vec::new(),
                slow: false,
                connect_after: None,
                wait_us: 0,
                live: 0,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `cmd` on the connection and gets it written: by this thread
    /// now, or, if another thread is writing, by that thread before it lets
    /// go. Connects first if there is no connection. With `eval`, a script
    /// goes as `EVAL` whatever the connection's server is known to have.
    pub(super) fn submit(
        &self,
        connector: &Connector,
        cmd: &Command,
        deadline: Instant,
        connect_timeout: Duration,
        eval: bool,
    ) -> Result<Ticket, Failure> {
        let mut st = self.lock();
        let bytes = cmd.bytes_for(if eval { 0 } else { st.scripts });
        st.outbox.extend_from_slice(bytes);
        let ticket = Ticket {
            epoch: st.epoch,
            seq: st.next_seq,
        };
        st.next_seq += 1;
        st.abandoned.push_back(false);
        st.live += 1;
        st = self.write_out(st, connector, deadline, connect_timeout);
        check(&st, ticket)?;
        Ok(ticket)
    }

    /// Takes the reply to `ticket`, reading it (and whatever comes before
    /// it) when no other thread is doing I/O. Unless `block`, returns `None`
    /// instead of sleeping while another thread does the I/O.
    pub(super) fn take(
        &self,
        connector: &Connector,
        ticket: Ticket,
        deadline: Instant,
        connect_timeout: Duration,
        block: bool,
    ) -> Option<Result<Value, Failure>> {
        let mut st = self.lock();
        let taken = loop {
            if let Err(failure) = check(&st, ticket) {
                break Some(Err(failure));
            }
            if let Some(i) = st.replies.iter().position(|(seq, _)| *seq == ticket.seq) {
                break Some(Ok(st.replies.swap_remove(i).1));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if st.next_read < st.written && can_read(&st) {
                if left.is_zero() && st.live > 1 {
                    // Late, and other threads still want replies on this
                    // connection: a read that timed out now would drop it
                    // for them too. Leave the reading to them.
                    give_up(&mut st, ticket.seq);
                    break Some(Err(Failure::TimedOut));
                }
                st = self.read_one(st, connector, deadline, connect_timeout);
                continue;
            }
            if ticket.seq >= st.written && !st.writing && !st.outbox.is_empty() {
                st = self.write_out(st, connector, deadline, connect_timeout);
                continue;
            }
            if left.is_zero() {
                give_up(&mut st, ticket.seq);
                break Some(Err(Failure::TimedOut));
            }
            if !block {
                break None;
            }
            st.sleepers.push(ticket.seq);
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if let Some(i) = st.sleepers.iter().position(|&seq| seq == ticket.seq) {
                st.sleepers.swap_remove(i);
            }
        };
        // Leaving: if replies are due and nobody reads them, wake the
        // sleepers, one of which takes the reading role over.
        if !st.sleepers.is_empty() && st.next_read < st.written && can_read(&st) {
            self.changed.notify_all();
        }
        taken
    }

    /// Whether writing to the node now means connecting first (it has no
    /// connection, and is not backing off reconnecting): that may block up
    /// to the connect timeout.
    pub(super) fn will_connect(&self) -> bool {
        let st = self.lock();
        !st.open && !st.writing && st.connect_after.is_none_or(|after| after <= Instant::now())
    }

    /// How late this node tends to answer, coarsely (a power-of-two bucket
    /// of the average time a read of it blocked; the largest value once its
    /// last connection timed out): rounds read the nodes in this order, so
    /// a round that a quorum decided need not wait for the slow ones.
    pub(super) fn lateness(&self) -> u32 {
        let st = self.lock();
        if st.slow {
            u32::MAX
        } else {
            st.wait_us.max(1).ilog2()
        }
    }

    /// Whether the connection has so many unread replies that the next
    /// round should wait for its reply rather than leave it unread.
    pub(super) fn backlogged(&self, ticket: Ticket) -> bool {
        let st = self.lock();
        st.epoch == ticket.epoch && ticket.seq >= st.next_read + MAX_BACKLOG
    }

    /// The reply to `ticket` is no longer wanted: discard it when it comes.
    pub(super) fn abandon(&self, ticket: Ticket) {
        let mut st = self.lock();
        if st.epoch != ticket.epoch {
            return;
        }
        match st.replies.iter().position(|(seq, _)| *seq == ticket.seq) {
            Some(i) => {
                let (_, reply) = st.replies.swap_remove(i);
                forget_scripts_if_lost(&mut st, &reply);
            }
            None => give_up(&mut st, ticket.seq),
        }
    }

    /// Records whether the server of `ticket`'s connection has `script`.
    pub(super) fn note_script(&self, ticket: Ticket, bit: u8, known: bool) {
        let mut st = self.lock();
        if st.epoch == ticket.epoch {
            if known {
                st.scripts |= bit;
            } else {
                st.scripts &= !bit;
            }
        }
    }

    /// The writing role: writes the outbox until it is empty (connecting
    /// first if there is no connection), then lets go. If another thread is
    /// writing, it writes the outbox before it lets go. The lock is not held
    /// during I/O.
    fn write_out<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        connector: &Connector,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> MutexGuard<'a, State> {
        if st.writing || st.outbox.is_empty() {
            return st;
        }
        let epoch = st.epoch;
        st.writing = true;
        // Nobody reads a connection before its handshake is over.
        let connecting = !st.open;
        if connecting {
            st.open = true;
            st.reading = true;
        }
        let mut writer = st.writer.take();
        let mut connecting = connecting;
        while !st.outbox.is_empty() {
            let out = std::mem::take(&mut st.outbox);
            let count = st.next_seq - st.written;
            let connect_after = st.connect_after;
            drop(st);
            let mut opened = None;
            let (mut w, sent) = match writer.take() {
                Some(w) => (Some(w), Ok(())),
                None => {
                    match connector.connect_unless_backing_off(
                        connect_after,
                        deadline,
                        connect_timeout,
                    ) {
                        Ok((w, reader, scripts)) => {
                            opened = Some((reader, scripts));
                            (Some(w), Ok(()))
                        }
                        Err(failure) => (None, Err(failure)),
                    }
                }
            };
            let sent = sent.and_then(|()| match &mut w {
                Some(w) => w.send(&out, deadline),
                None => Ok(()),
            });
            st = self.lock();
            if st.epoch != epoch {
                // The reader ended the connection meanwhile: what was just
                // written failed with it.
                break;
            }
            if opened.is_some() {
                st.connect_after = None;
            }
            match (sent, w) {
                (Ok(()), Some(w)) => {
                    if let Some((reader, scripts)) = opened {
                        st.whole = w.is_whole();
                        st.reader = reader;
                        st.scripts = scripts;
                    }
                    if connecting {
                        // The handshake is over: replies may be read now,
                        // while more is written.
                        connecting = false;
                        st.reading = false;
                        if !st.sleepers.is_empty() {
                            self.changed.notify_all();
                        }
                    }
                    writer = Some(w);
                    st.written += count;
                    if st.outbox.is_empty() {
                        // Keep the buffer's capacity for the next batch.
                        st.outbox = out;
                        st.outbox.clear();
                    }
                }
                (Err(Failure::ConnectTimedOut), _) => {
                    st.connect_after = Instant::now().checked_add(connector.reconnect_backoff);
                    end_epoch(&mut st, Failure::TimedOut);
                    break;
                }
                (Err(failure), w) => {
                    // The cause is recorded first: ending the socket makes the
                    // reader fail too, for no reason of its own.
                    end_epoch(&mut st, failure);
                    if let Some(w) = w {
                        w.shutdown();
                    }
                    break;
                }
                (Ok(()), None) => break,
            }
        }
        if st.epoch == epoch {
            st.writer = writer;
            st.writing = false;
            if connecting {
                st.reading = false;
            }
        }
        // Sleepers want replies: a thread that is reading wakes them when it
        // lets go. Otherwise what was written may be theirs to read now.
        if !st.sleepers.is_empty() && (!st.reading || st.epoch != epoch) {
            self.changed.notify_all();
        }
        st
    }

    /// The reading role: reads one reply and hands it to its thread (or
    /// discards it), then lets go; over a whole connection, then writes
    /// what was queued meanwhile. The lock is not held during I/O.
    fn read_one<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        connector: &Connector,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> MutexGuard<'a, State> {
        let epoch = st.epoch;
        let whole = st.whole;
        st.reading = true;
        if whole {
            st.writing = true;
        }
        let mut reader = st.reader.take();
        let mut writer = if whole { st.writer.take() } else { None };
        drop(st);
        let began = Instant::now();
        let received = match (&mut reader, &mut writer) {
            (Some(r), _) => r.recv(deadline),
            (None, Some(w)) => w.recv(deadline),
            (None, None) => Err(Failure::Error(NodeError::Io(
                "the connection has no reading half".to_string(),
            ))),
        };
        let waited = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
        st = self.lock();
        let mut wake = false;
        if st.epoch == epoch {
            match received {
                Ok(value) => {
                    st.slow = false;
                    st.wait_us = st.wait_us - st.wait_us / 8 + waited / 8;
                    let seq = st.next_read;
                    wake = st.sleepers.contains(&seq);
                    st.next_read += 1;
                    if st.abandoned.pop_front().unwrap_or(false) {
                        forget_scripts_if_lost(&mut st, &value);
                    } else {
                        st.live -= 1;
                        st.replies.push((seq, value));
                    }
                    st.reader = reader;
                    st.reading = false;
                    if whole {
                        st.writer = writer;
                        st.writing = false;
                    }
                }
                Err(failure) => {
                    // The cause is recorded first: ending the socket makes
                    // a writer fail too, for no reason of its own.
                    end_epoch(&mut st, failure);
                    if let Some(r) = &reader {
                        r.shutdown();
                    }
                    wake = true;
                }
            }
        }
        if wake && !st.sleepers.is_empty() {
            self.changed.notify_all();
        }
        if whole {
            st = self.write_out(st, connector, deadline, connect_timeout);
        }
        st
    }
}

/// Fails `ticket` if its epoch has ended.
fn check(st: &State, ticket: Ticket) -> Result<(), Failure> {
    if st.epoch == ticket.epoch {
        return Ok(());
    }
    Err(match &st.ended {
        Some((epoch, failure)) if *epoch == ticket.epoch => failure.clone(),
        _ => Failure::Error(NodeError::Io(
            "the connection was dropped after an earlier failure".to_string(),
        )),
    })
}

/// Marks a request's reply as unwanted.
fn give_up(st: &mut State, seq: u64) {
    st.live -= 1;
    if let Some(flag) = seq
        .checked_sub(st.next_read)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| st.abandoned.get_mut(i))
    {
        *flag = true;
    }
}

/// An unread request was answered `NOSCRIPT`: the server lost our scripts
/// (`SCRIPT FLUSH`), so send them as `EVAL` from now on. The request itself
/// is not sent again: it could land behind a later command of ours and undo
/// it. (A release or extension left unread that way did not happen on that
/// node; the key keeps its TTL there. The quorum had already answered.)
fn forget_scripts_if_lost(st: &mut State, reply: &Value) {
    if is_noscript(reply) {
        st.scripts = 0;
    }
}

/// Drops the connection for everyone: every request on it fails.
fn end_epoch(st: &mut State, failure: Failure) {
    if let Some(writer) = &st.writer {
        writer.shutdown();
    }
    if let Some(reader) = &st.reader {
        reader.shutdown();
    }
    st.open = false;
    st.whole = false;
    st.writer = None;
    st.reader = None;
    st.writing = false;
    st.reading = false;
    st.slow = failure == Failure::TimedOut;
    st.ended = Some((st.epoch, failure));
    st.epoch += 1;
    st.scripts = 0;
    st.outbox.clear();
    st.next_seq = 0;
    st.written = 0;
    st.next_read = 0;
    st.replies.clear();
    st.abandoned.clear();
    st.live = 0;
}

/// Whether a thread may take the reading role now.
fn can_read(st: &State) -> bool {
    !st.reading && (!st.whole || !st.writing)
}
