//! One multiplexed round. It writes the same command to every node, then
//! reads the replies against one deadline, until the caller says it is
//! decided.
//!
//! A round knows connections and deadlines, not what a reply means: the
//! caller's `decided` callback counts.

use std::panic::resume_unwind;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use crate::error::{Failure, NodeError};
use crate::node::{Bounds, Node, Turn, Write};
use crate::store::script::Command;

/// Where the next round starts reading.
static ROTATION: AtomicUsize = AtomicUsize::new(0);

/// One node's result in a round: its reply or why there is none, and when.
pub(crate) struct Reply {
    pub(crate) result: Result<Value, Failure>,
    pub(crate) elapsed: Duration,
}

/// Runs `cmd` on the nodes for which `ask` is true. Returns one reply per
/// node, in node order.
///
/// `decided` is the tally: the fewest results that can decide the round,
/// and a callback run after each result. Once the callback returns true,
/// the outstanding replies are left to be discarded later. Nothing blocks
/// past the `bounds`' deadline, but a reply already here is still collected.
pub(crate) fn run(
    nodes: &[Node],
    cmd: &Command,
    start: Instant,
    bounds: Bounds,
    ask: impl Fn(usize) -> bool,
    (to_decide, decided): (usize, impl FnMut(&Result<Value, Failure>) -> bool),
) -> Vec<Reply> {
    let mut turn = Turn::new(nodes, bounds);
    let not_awaited = || Reply {
        result: Err(Failure::NotAwaited),
        elapsed: Duration::ZERO,
    };
    let mut round = Round {
        start,
        replies: nodes.iter().map(|_| not_awaited()).collect(),
        decided,
        done: false,
        to_decide,
        resent: Vec::new(),
    };
    let (connecting, connected) = by_connect(nodes, &ask);
    for (i, queued) in turn.queue(cmd, &connected, connecting.is_empty()) {
        round.record(i, queued.and(Err(Failure::NotAwaited)));
    }
    // Connect the others side by side: one hung connect must not use up the others' time.
    let connect = |i: usize| nodes[i].submit(cmd, bounds, Write::Batched);
    for (i, sent) in side_by_side(&connecting, connect) {
        sent.iter().for_each(|&(ticket, _)| turn.sent(i, ticket));
        round.record(i, sent.and(Err(Failure::NotAwaited)));
    }
    let mut pending = connected;
    pending.extend(connecting);
    pending.retain(|&i| turn.awaits(i));
    // Read slow nodes last, so a quorum decides without them. Equally quick
    // ones rotate, to spread the replies left unread.
    pending.sort_unstable();
    let rotation = ROTATION.fetch_add(1, Ordering::Relaxed) % pending.len().max(1);
    pending.rotate_left(rotation);
    // (Each node asked once: the question takes its lock.)
    pending.sort_by_cached_key(|&i| nodes[i].lateness());
    round.read_until_decided(&mut turn, cmd, &mut pending);
    // Decided: pending replies are discarded later, unless a connection
    // has so many unread that it is drained now.
    for i in pending {
        if let Some(result) = turn.leave_unread(i, cmd) {
            round.record(i, result);
        }
    }
    round.replies
}

/// One round under way: what came back, and the caller's tally.
struct Round<D> {
    start: Instant,
    replies: Vec<Reply>,
    /// The caller's tally: true once the outcome is decided.
    decided: D,
    /// `decided` returned true: stop waiting for replies.
    done: bool,
    /// The fewest results that can decide the round, less those `decided` has counted.
    to_decide: usize,
    /// The nodes whose command went once more, on a new connection.
    resent: Vec<usize>,
}

impl<D: FnMut(&Result<Value, Failure>) -> bool> Round<D> {
    /// Reads replies, in `pending`'s order as they come, until decided or
    /// none is left. The nodes not read stay in `pending`.
    fn read_until_decided(&mut self, turn: &mut Turn, cmd: &Command, pending: &mut Vec<usize>) {
        while !pending.is_empty() && !self.done {
            // Take what needs no sleep: a stored reply, or a connection nobody else reads.
            let before = pending.len();
            let mut k = 0;
            while k < pending.len() && !self.done {
                let i = pending[k];
                match turn.poll(i, cmd) {
                    // A closed connection (the node restarted): send once more, on a new one.
                    Some(Err(Failure::Error(NodeError::Io(e)))) if !self.resent.contains(&i) => {
                        self.resent.push(i);
                        match turn.resend(i, cmd, Failure::Error(NodeError::Io(e))) {
                            Ok(()) => k += 1,
                            Err(failure) => self.record(pending.remove(k), Err(failure)),
                        }
                    }
                    Some(result) => self.record(pending.remove(k), result),
                    None => k += 1,
                }
            }
            // Other threads read (or owe the write of) every awaited
            // connection: sleep until enough replies are handed over.
            if pending.len() == before && !self.done {
                let need = self.to_decide.clamp(1, before);
                turn.sleep_on(pending, need);
            }
        }
    }

    /// Records node `i`'s result, or `NotAwaited` while its reply is awaited.
    /// Counts it, unless it is `NotAwaited` or the round is decided.
    fn record(&mut self, i: usize, result: Result<Value, Failure>) {
        self.replies[i].elapsed = self.start.elapsed();
        if result != Err(Failure::NotAwaited) && !self.done {
            self.to_decide = self.to_decide.saturating_sub(1);
            self.done = (self.decided)(&result);
        }
        self.replies[i].result = result;
    }
}

/// The nodes for which `ask` is true: those that must connect first, and the others.
fn by_connect(nodes: &[Node], ask: impl Fn(usize) -> bool) -> (Vec<usize>, Vec<usize>) {
    (0..nodes.len())
        .filter(|&i| ask(i))
        .partition(|&i| nodes[i].will_connect())
}

/// Runs `f` for each of `items`, the first here and each other on its own
/// thread. Where no thread starts, it runs here after the first. Returns
/// the results with their items.
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
            let joined = thread.map(|t| t.join().unwrap_or_else(|panic| resume_unwind(panic)));
            results.push((i, joined.unwrap_or_else(|| f(i))));
        }
        results
    })
}

/// Writes `cmd` to the nodes for which `ask` is true, without waiting for
/// replies. For clean-up: a node that cannot take it now is owed it until
/// `owed_until`, first on its next connection. A script goes as `EVAL`:
/// nobody reads the reply, so a `NOSCRIPT` would go unnoticed.
pub(crate) fn send_only(
    nodes: &[Node],
    cmd: &Command,
    bounds: Bounds,
    owed_until: Instant,
    ask: impl Fn(usize) -> bool,
) {
    // Connect side by side, as in a round: one connect timeout at most.
    let (connecting, connected) = by_connect(nodes, &ask);
    let send = |i: usize| nodes[i].send(cmd, bounds, owed_until);
    connected.into_iter().for_each(send);
    side_by_side(&connecting, send);
}
