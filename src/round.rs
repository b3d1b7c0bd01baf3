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
use crate::node::{Node, Ticket};
use crate::script::{is_noscript, Command};

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
/// After each reply (or failure) `decided` is called; once it returns true,
/// the replies still outstanding are not waited for: they are read and
/// discarded later, before anything else on their connections. Nothing in
/// here blocks past `deadline`, except that a reply already received is
/// still collected just after it.
pub(crate) fn run(
    nodes: &[Node],
    cmd: &Command,
    start: Instant,
    deadline: Instant,
    connect_timeout: Duration,
    ask: impl Fn(usize) -> bool,
    mut decided: impl FnMut(&Result<Value, Failure>) -> bool,
) -> Vec<Reply> {
    let mut done = false;
    let mut replies: Vec<Reply> = Vec::with_capacity(nodes.len());
    for _ in nodes {
        replies.push(Reply {
            result: Err(Failure::NotAwaited),
            elapsed: Duration::ZERO,
            ticket: None,
        });
    }
    // Write first to the nodes that are connected, so their replies travel
    // while we connect to the others; connect those side by side, so that
    // one node whose connect hangs does not use up the others' time.
    let (connecting, connected) = by_connect(nodes, &ask);
    let submit = |i: usize| nodes[i].submit(cmd, deadline, connect_timeout);
    let mut record = |i: usize, result: Result<Ticket, Failure>| {
        let ticket = result.as_ref().ok().copied();
        // Until its reply is read, a node that was sent the command stands
        // as not awaited.
        let result = result.and(Err(Failure::NotAwaited));
        if result != Err(Failure::NotAwaited) && !done {
            done = decided(&result);
        }
        replies[i] = Reply {
            result,
            elapsed: start.elapsed(),
            ticket,
        };
    };
    for &i in &connected {
        record(i, submit(i));
    }
    for (i, result) in side_by_side(&connecting, submit) {
        record(i, result);
    }
    let mut order = connected;
    order.extend(connecting);

    // Read the nodes that keep us waiting (or timed out last time) after the
    // others, so a round that a quorum decided need not wait for them; among
    // equally quick nodes, rotate, so the replies left unread spread out.
    let mut pending = order;
    pending.sort_unstable();
    pending.retain(|&i| replies[i].ticket.is_some());
    let len = pending.len().max(1);
    pending.rotate_left(ROTATION.fetch_add(1, Ordering::Relaxed) % len);
    pending.sort_by_key(|&i| nodes[i].lateness());

    let mut finish =
        |replies: &mut [Reply], i: usize, mut result: Result<Value, Failure>, done: &mut bool| {
            let node = &nodes[i];
            let Some(mut ticket) = replies[i].ticket else {
                return;
            };
            if let Some(script) = cmd.script {
                for retry in [true, false] {
                    let lost = matches!(&result, Ok(value) if is_noscript(value));
                    let ran =
                        matches!(&result, Ok(value) if !matches!(value, Value::ServerError(_)));
                    if lost || ran {
                        node.note_script(ticket, script.bit, ran);
                    }
                    if !(lost && retry) {
                        break;
                    }
                    // The server lost our script: once more as EVAL, in the same
                    // round and against the same deadline.
                    result = node
                        .submit_eval(cmd, deadline, connect_timeout)
                        .and_then(|t| {
                            ticket = t;
                            node.wait(t, deadline, connect_timeout)
                        });
                }
            }
            replies[i].elapsed = start.elapsed();
            if !*done {
                *done = decided(&result);
            }
            replies[i].result = result;
        };

    while !pending.is_empty() {
        if done {
            for i in pending.drain(..) {
                let Some(ticket) = replies[i].ticket else {
                    continue;
                };
                if nodes[i].backlogged(ticket) {
                    let result = nodes[i].wait(ticket, deadline, connect_timeout);
                    finish(&mut replies, i, result, &mut done);
                } else {
                    nodes[i].abandon(ticket);
                }
            }
            break;
        }
        // Take whatever can be had without sleeping: a stored reply, or a
        // connection nobody else is reading.
        let mut progressed = false;
        let mut k = 0;
        while k < pending.len() && !done {
            let i = pending[k];
            let polled = replies[i]
                .ticket
                .and_then(|t| nodes[i].poll(t, deadline, connect_timeout));
            match polled {
                Some(result) => {
                    pending.remove(k);
                    finish(&mut replies, i, result, &mut done);
                    progressed = true;
                }
                None => k += 1,
            }
        }
        // Every connection still awaited is being read by another thread:
        // sleep until the first of them hands over our reply.
        if !progressed && !done {
            let i = pending.remove(0);
            if let Some(ticket) = replies[i].ticket {
                let result = nodes[i].wait(ticket, deadline, connect_timeout);
                finish(&mut replies, i, result, &mut done);
            }
        }
    }
    replies
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
/// the replies (they are read and discarded later). For best-effort clean-up.
/// A script goes as `EVAL`: nobody reads the reply, so a `NOSCRIPT` would
/// go unnoticed.
pub(crate) fn send_only(
    nodes: &[Node],
    cmd: &Command,
    deadline: Instant,
    connect_timeout: Duration,
    ask: impl Fn(usize) -> bool,
) {
    // As in a round: nodes that must be connected first are connected side
    // by side, so that the clean-up costs one connect timeout at most.
    let (connecting, connected) = by_connect(nodes, &ask);
    let send = |i: usize| {
        if let Ok(ticket) = nodes[i].submit_eval(cmd, deadline, connect_timeout) {
            nodes[i].abandon(ticket);
        }
    };
    connected.into_iter().for_each(send);
    side_by_side(&connecting, send);
}
