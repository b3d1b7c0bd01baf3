//! One multiplexed round: the same command to every node, written to every
//! node first, then the replies read against one deadline, until the caller
//! says the outcome is decided.
//!
//! A round knows connections and deadlines, not what a reply means for the
//! lock: the caller's `decided` callback does the counting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use crate::error::Failure;
use crate::node::{Enlisted, Node, Pace, Ticket, Waiter, FLUSH_GRACE, RECHECK};
use crate::script::Command;

/// From how many rounds awaiting replies on the wire a round that starts
/// alone (no other thread awake) leaves its command queued for the batch
/// that those replies will set off, rather than write it alone: below
/// this, the wait for the batch costs more than the write it saves (at 2
/// and 4 threads, a fifth of the pairs per second; see the README's
/// Performance section).
const BATCH_FROM: u64 = 6;

/// How many times a round gives up the CPU (`thread::yield_now`) before it
/// parks to wait for its replies. The threads that run meanwhile are often
/// the ones reading those replies; a reply stored while its round still
/// yields costs no futex call and no sleep. At 8 and 16 threads it raised
/// pairs per second by a tenth (see the README's Performance section).
const YIELDS: u32 = 4;

/// Where the next round starts reading.
static ROTATION: AtomicUsize = AtomicUsize::new(0);

/// One node's result in a round: its reply or why there is none, and when.
pub(crate) struct Reply {
    pub(crate) result: Result<Value, Failure>,
    pub(crate) elapsed: Duration,
    /// The request on the node's connection, if it was sent.
    ticket: Option<Ticket>,
}

/// Runs `cmd` on the nodes for which `ask` is true. Returns one reply a node,
/// in node order.
///
/// `decided` is the tally: the fewest results that can decide the round,
/// and a callback called after each reply (or failure). A round asleep is
/// woken once as many replies are in as could decide it (one wake-up, not
/// one per node). Once the callback returns true, the replies still
/// outstanding are not waited for: they are read and discarded later,
/// before anything else on their connections. Nothing in
/// here blocks past `deadline`, except that a reply already received is
/// still collected just after it.
pub(crate) fn run(
    nodes: &[Node],
    cmd: &Command,
    start: Instant,
    deadline: Instant,
    connect_timeout: Duration,
    ask: impl Fn(usize) -> bool,
    (to_decide, decided): (usize, impl FnMut(&Result<Value, Failure>) -> bool),
) -> Vec<Reply> {
    let mut round = Round {
        nodes,
        cmd,
        start,
        deadline,
        connect_timeout,
        replies: nodes
            .iter()
            .map(|_| Reply {
                result: Err(Failure::NotAwaited),
                elapsed: Duration::ZERO,
                ticket: None,
            })
            .collect(),
        decided,
        done: false,
        to_decide,
        counted: 0,
        flush_by: None,
        batch_until: None,
        pace: nodes.first().map(Node::pace),
        held: false,
    };
    let (connecting, connected) = by_connect(nodes, &ask);
    round.queue_on_connected(&connected, connecting.is_empty());
    round.connect_the_rest(&connecting);
    let order = round.order_for_reading(connected, connecting);
    let left = round.read_until_decided(order);
    round.leave_the_rest(left);
    round.leave();
    std::mem::take(&mut round.replies)
}

/// One round under way: what it runs where, and what came back.
struct Round<'a, D> {
    nodes: &'a [Node],
    cmd: &'a Command,
    start: Instant,
    deadline: Instant,
    connect_timeout: Duration,
    replies: Vec<Reply>,
    /// The caller's tally: true once the outcome is decided.
    decided: D,
    /// `decided` returned true: stop waiting for replies.
    done: bool,
    /// The fewest results that can decide the round, and how many
    /// `decided` has counted.
    to_decide: usize,
    counted: usize,
    /// When a thread awake is overdue writing our queued commands.
    flush_by: Option<Instant>,
    /// Our commands wait for the next batch (see [`BATCH_FROM`]) until
    /// then, even while no thread is awake.
    batch_until: Option<Instant>,
    /// The client's pace (the same on every node), and whether this round
    /// holds it: from its start until its commands are queued, and again
    /// once woken with a reply, until it blocks or ends.
    pace: Option<&'a Pace>,
    held: bool,
}

impl<D> Round<'_, D> {
    /// Lets go of the pace, if held, before blocking on the nodes still
    /// awaited: see [`let_go`](Self::let_go).
    fn release(&mut self) {
        self.let_go(false, false);
    }

    /// Lets go of the pace, if held, before leaving the round.
    fn leave(&mut self) {
        self.end_batch(true);
        self.let_go(true, false);
    }

    /// Stops waiting for the next batch (see [`BATCH_FROM`]): writes the
    /// round's commands still queued. For a round that leaves, blocks on
    /// one node, or waited its [`FLUSH_GRACE`]; `wake_reader` as for
    /// [`Node::flush`].
    fn end_batch(&mut self, wake_reader: bool) {
        if self.batch_until.take().is_none() {
            return;
        }
        for (node, reply) in self.nodes.iter().zip(&self.replies) {
            if reply.ticket.is_some_and(|t| !node.written(t)) {
                node.flush(self.deadline, self.connect_timeout, wake_reader);
            }
        }
    }

    /// Lets go of the pace, if held. The last thread to let go writes what
    /// every node has queued, and wakes a sleeper to read a node whose
    /// replies are due and unread; unless it goes on to read that node
    /// itself (it awaits a reply there and is not `leaving`): like an event
    /// loop, it then reads its nodes in turn, and the replies it reads wake
    /// the other threads. With `batch`, it leaves the queues of its own
    /// nodes for the next batch (see [`BATCH_FROM`]).
    fn let_go(&mut self, leaving: bool, batch: bool) {
        if !std::mem::take(&mut self.held) || !self.pace.is_some_and(Pace::release) {
            return;
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let reads_next = !leaving && self.awaits(i);
            if !(reads_next && batch) {
                node.flush(self.deadline, self.connect_timeout, !reads_next);
            }
        }
    }

    /// Whether the round was sent a command to node `i` and has no reply
    /// from it yet.
    fn awaits(&self, i: usize) -> bool {
        let reply = &self.replies[i];
        reply.ticket.is_some() && reply.result == Err(Failure::NotAwaited)
    }
}

impl<D> Drop for Round<'_, D> {
    fn drop(&mut self) {
        self.leave();
    }
}

impl<D: FnMut(&Result<Value, Failure>) -> bool> Round<'_, D> {
    /// Queues the command on the nodes that are connected, first, so that
    /// their replies travel while we connect to the others. It is written
    /// with the commands of the client's other threads, in one write per
    /// node, by the last of them to let go of the pace: this thread, unless
    /// others are queuing too.
    ///
    /// A round that starts alone (no other thread awake) writes its
    /// command at once, unless at least [`BATCH_FROM`] other rounds await
    /// replies on the wire from each of its nodes (all split connections,
    /// that answer quickly) and it connects to no node (`may_batch`): the
    /// threads those replies wake write it then, with their own next
    /// commands, as an event loop would. Otherwise the thread that left a
    /// round last, having written every other thread's next command,
    /// would write its own next command alone. The wait is bounded: the
    /// round writes its commands itself after [`FLUSH_GRACE`] (every read
    /// it makes meanwhile pauses then), and before it leaves or blocks on
    /// one node ([`wait_for`](Self::wait_for)).
    fn queue_on_connected(&mut self, connected: &[usize], may_batch: bool) {
        let mut alone = false;
        if let Some(pace) = self.pace.filter(|_| !self.held) {
            alone = pace.hold();
            self.held = true;
        }
        for &i in connected {
            let sent = self.nodes[i].queue(self.cmd, self.deadline, self.connect_timeout);
            self.sent(i, sent);
        }
        let batch = may_batch
            && alone
            && !connected.is_empty()
            && connected
                .iter()
                .all(|&i| self.nodes[i].awaited_on_wire() >= BATCH_FROM);
        if batch {
            let by = Instant::now() + FLUSH_GRACE;
            self.batch_until = Some(by);
            self.flush_by = Some(by);
        }
        self.let_go(false, batch);
    }

    /// Connects to the other nodes side by side, so that one node whose
    /// connect hangs does not use up the others' time, and writes the
    /// command to each.
    fn connect_the_rest(&mut self, connecting: &[usize]) {
        let (nodes, cmd, deadline, connect_timeout) =
            (self.nodes, self.cmd, self.deadline, self.connect_timeout);
        let submit = |i: usize| nodes[i].submit(cmd, deadline, connect_timeout);
        for (i, sent) in side_by_side(connecting, submit) {
            self.sent(i, sent);
        }
    }

    /// Records that the command was written to node `i` (its ticket), or
    /// why not (which counts as its reply).
    fn sent(&mut self, i: usize, sent: Result<Ticket, Failure>) {
        let ticket = sent.as_ref().ok().copied();
        // Until its reply is read, a node that was sent the command stands
        // as not awaited.
        let result = sent.and(Err(Failure::NotAwaited));
        if result != Err(Failure::NotAwaited) && !self.done {
            self.counted += 1;
            self.done = (self.decided)(&result);
        }
        self.replies[i] = Reply {
            result,
            elapsed: self.start.elapsed(),
            ticket,
        };
    }

    /// The nodes to read, in the order to read them: the nodes that keep us
    /// waiting (or timed out last time) after the others, so a round that a
    /// quorum decided need not wait for them; among equally quick nodes,
    /// rotated, so the replies left unread spread out.
    fn order_for_reading(&self, connected: Vec<usize>, connecting: Vec<usize>) -> Vec<usize> {
        let mut order = connected;
        order.extend(connecting);
        order.sort_unstable();
        order.retain(|&i| self.replies[i].ticket.is_some());
        let len = order.len().max(1);
        order.rotate_left(ROTATION.fetch_add(1, Ordering::Relaxed) % len);
        // (Each node asked once: the question takes its lock.)
        order.sort_by_cached_key(|&i| self.nodes[i].lateness());
        order
    }

    /// Reads replies, in `pending`'s order as far as they come, until the
    /// outcome is decided or none is left. Returns the nodes not read.
    fn read_until_decided(&mut self, mut pending: Vec<usize>) -> Vec<usize> {
        while !pending.is_empty() && !self.done {
            // Take whatever can be had without sleeping: a stored reply, or
            // a connection nobody else is reading.
            let mut progressed = false;
            let mut k = 0;
            while k < pending.len() && !self.done {
                if self.batch_until.is_some_and(|by| Instant::now() >= by) {
                    // No batch came in time: write our commands ourselves.
                    self.end_batch(false);
                }
                let i = pending[k];
                // A poll may block on a read.
                self.release();
                let mut held = false;
                let polled = self.replies[i].ticket.and_then(|t| {
                    self.nodes[i].poll(
                        self.cmd,
                        t,
                        self.deadline,
                        self.connect_timeout,
                        self.batch_until,
                        &mut held,
                    )
                });
                self.held |= held;
                match polled {
                    Some(result) => {
                        pending.remove(k);
                        self.received(i, result);
                        progressed = true;
                    }
                    None => k += 1,
                }
            }
            // Every connection still awaited is being read by another
            // thread (or its write is owed by one): sleep until enough of
            // our replies are handed over to decide, on any of them.
            if !progressed && !self.done {
                self.sleep_on(&pending);
            }
        }
        pending
    }

    /// The outcome is decided: leaves the replies of `unread` to be read
    /// and discarded later, except on a connection with so many unread
    /// replies that it is drained now.
    fn leave_the_rest(&mut self, unread: Vec<usize>) {
        for i in unread {
            let Some(ticket) = self.replies[i].ticket else {
                continue;
            };
            if self.nodes[i].backlogged(ticket) {
                self.wait_for(i);
            } else {
                self.nodes[i].abandon(ticket);
            }
        }
    }

    /// Sleeps until as many of `pending`'s replies are stored as could
    /// decide the round, or a reading role among them is free, or a
    /// connection ends, or the deadline (or, while a command is queued, the
    /// grace of the thread owing its write) passes. The caller polls after.
    fn sleep_on(&mut self, pending: &[usize]) {
        self.release();
        let need = self
            .to_decide
            .saturating_sub(self.counted)
            .clamp(1, pending.len().max(1));
        let waiter = Waiter::new(need);
        let mut enlisted = Vec::with_capacity(pending.len());
        let mut ready = false;
        let mut queued = false;
        for &i in pending {
            let Some(ticket) = self.replies[i].ticket else {
                continue;
            };
            match self.nodes[i].enlist(ticket, &waiter) {
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
        let mut until = self.deadline.min(Instant::now() + RECHECK);
        if queued {
            until = until.min(
                *self
                    .flush_by
                    .get_or_insert_with(|| Instant::now() + FLUSH_GRACE),
            );
        }
        for _ in 0..YIELDS {
            if ready || waiter.woken() || Instant::now() >= until {
                break;
            }
            std::thread::yield_now();
        }
        while !ready && !waiter.woken() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::park_timeout(left);
        }
        for &(i, ticket) in &enlisted {
            self.nodes[i].delist(ticket);
        }
        self.held |= waiter.holds_pace();
        if queued && !waiter.woken() && self.flush_by.is_some_and(|by| Instant::now() >= by) {
            // The thread owing the write is overdue: write it ourselves.
            for &(i, _) in &enlisted {
                self.nodes[i].flush(self.deadline, self.connect_timeout, false);
            }
        }
    }

    /// Waits for node `i`'s reply, and records it.
    fn wait_for(&mut self, i: usize) {
        if let Some(ticket) = self.replies[i].ticket {
            self.end_batch(true);
            self.release();
            let mut held = false;
            let result = self.nodes[i].wait(
                self.cmd,
                ticket,
                self.deadline,
                self.connect_timeout,
                &mut held,
            );
            self.held |= held;
            self.received(i, result);
        }
    }

    /// Records node `i`'s reply, and counts it unless the outcome is
    /// already decided.
    fn received(&mut self, i: usize, result: Result<Value, Failure>) {
        self.replies[i].elapsed = self.start.elapsed();
        if !self.done {
            self.counted += 1;
            self.done = (self.decided)(&result);
        }
        self.replies[i].result = result;
    }
}

/// The nodes for which `ask` is true: those that must be connected first
/// (which may take up to the connect timeout), and the others.
fn by_connect(nodes: &[Node], ask: impl Fn(usize) -> bool) -> (Vec<usize>, Vec<usize>) {
    (0..nodes.len())
        .filter(|&i| ask(i))
        .partition(|&i| nodes[i].will_connect())
}

/// Runs `f` for each of `items`, the first on this thread and the others
/// each on a thread of its own (or here, after the first, if no thread can
/// be started), and returns the results with their items.
fn side_by_side<T: Send>(items: &[usize], f: impl Fn(usize) -> T + Sync) -> Vec<(usize, T)> {
    let Some((&first, rest)) = items.split_first() else {
        return Vec::new();
    };
    std::thread::scope(|s| {
        let f = &f;
        let started: Vec<_> = rest
            .iter()
            .map(|&i| {
                let thread = std::thread::Builder::new()
                    .name("redlock-sync connect".to_string())
                    .spawn_scoped(s, move || f(i));
                (i, thread.ok())
            })
            .collect();
        let mut results = vec![(first, f(first))];
        for (i, thread) in started {
            let result = match thread.map(|t| t.join()) {
                Some(Ok(result)) => result,
                Some(Err(panic)) => std::panic::resume_unwind(panic),
                None => f(i),
            };
            results.push((i, result));
        }
        results
    })
}

/// Writes `cmd` to the nodes for which `ask` is true and does not wait for
/// the replies (they are read and discarded later). For clean-up: a node
/// that cannot be sent it now is owed it until `owed_until`, and gets it
/// first on its next connection. A script goes as `EVAL`: nobody reads the
/// reply, so a `NOSCRIPT` would go unnoticed.
pub(crate) fn send_only(
    nodes: &[Node],
    cmd: &Command,
    deadline: Instant,
    connect_timeout: Duration,
    owed_until: Instant,
    ask: impl Fn(usize) -> bool,
) {
    // As in a round: nodes that must be connected first are connected side
    // by side, so that the clean-up costs one connect timeout at most.
    let (connecting, connected) = by_connect(nodes, &ask);
    let send = |i: usize| match nodes[i].submit_eval(cmd, deadline, connect_timeout) {
        Ok(ticket) => {
            // Queued behind another thread's write or connect, it may yet
            // be lost with that connection: owe it too (a release sent
            // twice is harmless, its token guards it).
            if !nodes[i].written(ticket) {
                nodes[i].owe(cmd, owed_until);
            }
            nodes[i].abandon(ticket);
        }
        Err(_) => nodes[i].owe(cmd, owed_until),
    };
    connected.into_iter().for_each(send);
    side_by_side(&connecting, send);
}
