//! One watchdog thread per client, which keeps every guard of that client
//! alive, and one notifier thread, which runs the guards' loss callbacks:
//! the only threads a client's guards cost, however many there are.
//!
//! The watchdog starts with the first guard, holds the client weakly (the
//! guards hold it strongly), and exits when the client is dropped or after
//! [`IDLE`] with no guard. It sleeps until the earliest due extension; each
//! guard's lease says when it is due next. Every guard due by then (up to
//! [`MAX_BATCH`] a round) is extended in one round, whose script extends
//! them all on each node ([`Redlock::extend_all`]; each guard's votes
//! counted on their own): a guard that falls due while a round runs starts
//! in the next one, so its extension starts at most one round
//! (`connect_timeout` + `io_timeout`) after its point, however slow a node
//! is (and one round more for each [`MAX_BATCH`] guards due at once). A
//! failed extension is retried by the schedule, never by sleeping on
//! the watchdog. A guard claims its part of a round under its lease's
//! mutex, and a guard that is done claims none: none is written after its
//! release starts (see `with_lock.rs`). (A round, the watchdog's as any
//! other, connects several nodes that all need a new connection side by
//! side on short-lived threads, and resolves host names on a helper: with
//! the connections open, as while locks are held, it starts none.)
//!
//! Loss callbacks run on the notifier thread, one at a time, each under
//! `catch_unwind`, and only while their guard is not done: a callback that
//! blocks delays the callbacks after it, never an extension, and none runs
//! on the watchdog (where no notifier can start, the callbacks wait in the
//! queue for the next try). The notifier starts with the first callback and
//! exits when the client is dropped.
//!
//! User code is fenced off per lease: the retry policy's backoff, which
//! the watchdog asks after a failed extension, ends only the lease whose
//! turn it was if it panics (see `with_lock.rs`); a panic in the round
//! that extends a batch ends the leases of that batch, each told, none
//! dropped silently. The observer is called under `catch_unwind`.
//!
//! The observer hears of change, not of every round: a node's failure
//! when it starts and when the node answers again, an operation's failed
//! rounds when they start failing (or fail otherwise) and when they end,
//! each with a count ([`Failures`], and `Watch::down` for the nodes).

use std::collections::VecDeque;
use std::mem::{self, Discriminant};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::client::{Redlock, WeakRedlock};
use crate::error::{LockError, NodeOutcome, NodeReport, Report};
use crate::lock::{Lock, Token};
use crate::with_lock::Lease;

/// How long the watchdog waits with no guard before it exits; the next
/// guard starts it again.
const IDLE: Duration = Duration::from_secs(30);

/// The most guards one round extends, so that one script call stays short
/// on the nodes (each node runs it whole before anything else).
const MAX_BATCH: usize = 1024;

/// A callback to run on the notifier thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A client's watchdog and notifier (their schedule and queue, under one
/// lock and one condition variable), and what its observer was told of
/// each node.
#[derive(Default)]
pub(crate) struct Watch {
    schedule: Mutex<Schedule>,
    wake: Condvar,
    /// For each node, the rounds it failed in a row, as the observer knows.
    down: Mutex<Vec<u32>>,
}

/// A lease the watchdog keeps: when it is due next, the lease, and its
/// lock as the watchdog's extensions measure it.
pub(crate) type Entry = (Instant, Arc<Lease>, Lock);

#[derive(Default)]
struct Schedule {
    /// Every lease the watchdog keeps.
    leases: Vec<Entry>,
    running: bool,
    /// The client is gone: the watchdog exits, and the notifier once its
    /// queue is empty.
    closed: bool,
    /// The callbacks for the notifier, in order.
    notices: VecDeque<Job>,
    notifying: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f`; a panic in it comes back as its message.
pub(crate) fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let text = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| panic.downcast_ref::<String>().cloned());
        text.unwrap_or_else(|| "a panic".to_string())
    })
}

impl Watch {
    /// Puts `entry` under the watchdog of `client`; starts the watchdog if
    /// it does not run.
    pub(crate) fn add(self: &Arc<Self>, client: &Redlock, entry: Entry) -> std::io::Result<()> {
        let mut schedule = lock(&self.schedule);
        if !schedule.running {
            let (watch, client) = (Arc::clone(self), client.downgrade());
            std::thread::Builder::new()
                .name("redlock-watchdog".to_string())
                .spawn(move || watch.run(&client))?;
            schedule.running = true;
        }
        schedule.leases.push(entry);
        self.wake.notify_all();
        Ok(())
    }

    /// The client is gone: the watchdog exits at once.
    pub(crate) fn close(&self) {
        lock(&self.schedule).closed = true;
        self.wake.notify_all();
    }

    /// Queues `job` for the notifier thread, and starts it if it does not
    /// run. Where it cannot start, the job waits for the next call's try:
    /// it never runs here.
    pub(crate) fn notify(self: &Arc<Self>, job: Job) {
        let mut schedule = lock(&self.schedule);
        schedule.notices.push_back(job);
        if !schedule.notifying {
            let (watch, named) = (Arc::clone(self), std::thread::Builder::new());
            let named = named.name("redlock-notifier".to_string());
            schedule.notifying = named.spawn(move || watch.notifier()).is_ok();
        }
        self.wake.notify_all();
    }

    /// The notifier: runs the queued jobs one at a time, a panic in each
    /// caught; exits once the client is gone and the queue is empty.
    fn notifier(&self) {
        loop {
            let waiting = |s: &mut Schedule| s.notices.is_empty() && !s.closed;
            let schedule = self.wake.wait_while(lock(&self.schedule), waiting);
            let mut schedule = schedule.unwrap_or_else(PoisonError::into_inner);
            let Some(job) = schedule.notices.pop_front() else {
                return schedule.notifying = false;
            };
            drop(schedule);
            let _ = caught(job);
        }
    }

    /// The watchdog: waits for the next due leases, steps them, puts them
    /// back with their next due time.
    fn run(&self, weak: &WeakRedlock) {
        // The client is upgraded for one turn at a time: while the
        // watchdog waits, it does not keep its client alive.
        while let (Some(batch), Some(client)) = (self.next_batch(), weak.upgrade()) {
            let stepped = step_all(&client, batch);
            lock(&self.schedule).leases.extend(stepped);
        }
    }

    /// Waits until some leases are due, and takes them out of the
    /// schedule; `None` once closed or idle (the watchdog exits).
    fn next_batch(&self) -> Option<Vec<Entry>> {
        let (mut schedule, mut idle) = (lock(&self.schedule), false);
        loop {
            let now = Instant::now();
            if schedule.closed || idle {
                schedule.running = false;
                return None;
            }
            let leases = &mut schedule.leases;
            let mut room = MAX_BATCH;
            let due: Vec<_> = leases
                .extract_if(.., |(at, ..)| {
                    let take = *at <= now && room > 0;
                    room -= usize::from(take);
                    take
                })
                .collect();
            if !due.is_empty() {
                return Some(due);
            }
            let next = schedule.leases.iter().map(|(at, ..)| *at).min();
            let wait = next.map_or(IDLE, |at| at.saturating_duration_since(now));
            let waited =
                (self.wake.wait_timeout(schedule, wait)).unwrap_or_else(PoisonError::into_inner);
            schedule = waited.0;
            idle = waited.1.timed_out() && schedule.leases.is_empty();
        }
    }
}

/// Steps every lease of `batch`: extends in one round those that claim
/// an extension; returns the leases that stay, with their next due time.
/// A panic in the round ends the leases it extended, each told.
fn step_all(client: &Redlock, batch: Vec<Entry>) -> Vec<Entry> {
    let (mut kept, mut claimed) = (Vec::new(), Vec::new());
    for (_, lease, lock) in batch {
        match lease.claim(client) {
            Ok(ttl) => claimed.push((lease, lock, ttl)),
            Err(due) => kept.extend(due.map(|due| (due, lease, lock))),
        }
    }
    let mut round: Vec<_> = claimed.iter_mut().map(|(_, l, ttl)| (l, *ttl)).collect();
    let mut results = caught(|| client.extend_all(&mut round, 1)).map(Vec::into_iter);
    for (lease, lock, ttl) in claimed {
        let result = match &mut results {
            Ok(results) => results.next().unwrap_or(Ok(())),
            Err(panic) => Err(lease.panicked(format!("the extension round panicked: {panic}"))),
        };
        let due = lease.extended(client, &lock, ttl, result);
        kept.extend(due.map(|due| (due, lease, lock)));
    }
    kept
}

/// What an [`Event`] reports.
///
/// The observer hears of change, not of every round. An acquisition tells
/// [`Contended`](Self::Contended) or [`AttemptFailed`](Self::AttemptFailed)
/// when its rounds start failing and it waits to try again, and again only
/// if they fail for another reason; it ends with
/// [`Acquired`](Self::Acquired) or [`GaveUp`](Self::GaveUp). A guard's
/// watchdog tells [`ExtendFailed`](Self::ExtendFailed) in the same way,
/// then [`Extended`](Self::Extended) or [`Lost`](Self::Lost). A node's
/// failure is told once, [`NodeFailed`](Self::NodeFailed), until
/// [`NodeRecovered`](Self::NodeRecovered). [`Event::failures`] counts the
/// rounds that were not told one by one.
///
/// ```
/// use redlock_sync::{Event, What};
///
/// fn is_trouble(event: &Event<'_>) -> bool {
///     matches!(event.what, What::NodeFailed | What::ExtendFailed | What::Lost | What::GaveUp)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum What {
    /// An attempt won the lock ([`Event::failures`]: the rounds that
    /// failed before it).
    Acquired,
    /// An acquisition found the lock held by another client, and waits to
    /// try again.
    Contended,
    /// An acquisition failed otherwise (too few nodes answered, too slow),
    /// and waits to try again.
    AttemptFailed,
    /// An acquisition gave up ([`Event::error`] is what it returns).
    GaveUp,
    /// A node failed or timed out in a round, after answering until then
    /// ([`Event::node`] says which).
    NodeFailed,
    /// A node answered again ([`Event::failures`]: the rounds it had failed).
    NodeRecovered,
    /// An extension succeeded ([`Event::failures`]: the rounds that
    /// failed before it).
    Extended,
    /// In an extension, a node that had lost the key (a restart, an
    /// eviction) set it again ([`Event::node`] says which; see
    /// [`Redlock::extend`](crate::Redlock::extend)).
    Retook,
    /// A guard's extensions started failing; its watchdog retries them
    /// while validity is left.
    ExtendFailed,
    /// A guard's lock is lost (refused, or its validity ran out), or its
    /// guard released it ([`LockError::Panicked`]).
    Lost,
    /// A release round ended ([`Event::error`] says if it failed).
    Released,
}

impl What {
    /// The event of an acquisition's attempt that failed with `error`.
    pub(crate) fn attempt_failed(error: &LockError) -> What {
        match error {
            LockError::Contended { .. } => What::Contended,
            _ => What::AttemptFailed,
        }
    }
}

/// Something the client did, for logs and metrics: what the builder's
/// [`observer`](crate::RedlockBuilder::observer) gets (see [`What`] for
/// when). It carries the resource, the token's first 8 characters, the
/// node's address where there is one (never a password), timings and the
/// outcome; never a whole token. Its `Debug` output is a log line: the
/// error shows as its variant and the round's counts, since the nodes'
/// failures have events of their own.
///
/// ```
/// use redlock_sync::{Event, What};
///
/// fn log(event: &Event<'_>) {
///     if event.what == What::NodeFailed {
///         eprintln!("{} on {:?}: {:?}", event.resource, event.node, event.node_outcome);
///     }
/// }
/// ```
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Event<'a> {
    /// What happened.
    pub what: What,
    /// The (first) resource.
    pub resource: &'a str,
    /// The token's first 8 characters.
    pub token: &'a str,
    /// The attempt's number, for the acquisition's events; else 0.
    pub attempt: u32,
    /// The rounds that failed in a row, this one included: for a node's
    /// events its own, for the others the operation's (0 when none did).
    /// The events that end a run ([`What::Acquired`], [`What::GaveUp`],
    /// [`What::Extended`], [`What::Lost`], [`What::NodeRecovered`]) count
    /// all of its rounds, told or not: a metric of failed rounds adds
    /// theirs up.
    pub failures: u32,
    /// How long the round took, or the node's part of it.
    pub elapsed: Duration,
    /// The node, for the node's events.
    pub node: Option<&'a str>,
    /// What the node did, for the node's events.
    pub node_outcome: Option<&'a NodeOutcome>,
    /// The error, for the events of a failure.
    pub error: Option<&'a LockError>,
}

/// One line: the fields that are set, the node's outcome and the error
/// as text, the error without the nodes' failures.
impl std::fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut event = f.debug_struct("Event");
        let event = (event.field("what", &self.what))
            .field("resource", &self.resource)
            .field("token", &self.token);
        for (name, n) in [("attempt", self.attempt), ("failures", self.failures)] {
            if n > 0 {
                event.field(name, &n);
            }
        }
        event.field("elapsed", &self.elapsed);
        if let (Some(node), Some(outcome)) = (self.node, self.node_outcome) {
            event
                .field("node", &node)
                .field("outcome", &format_args!("{outcome}"));
        }
        if let Some(error) = self.error {
            // The variant's name is the first word of its `Debug` output.
            let debug = format!("{error:?}");
            let name = debug.split(|c: char| !c.is_alphanumeric()).next();
            match (name, error.report()) {
                (Some(name), Some(r)) => event.field("error", &format_args!("{name} ({r:#})")),
                _ => event.field("error", &format_args!("{error}")),
            };
        }
        event.finish()
    }
}

/// The builder's observer.
#[derive(Clone)]
pub(crate) struct Observer(pub(crate) Arc<dyn Fn(&Event<'_>) + Send + Sync>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// The failed rounds of one operation in a row, as its observer is told
/// of them: the first, and one that fails for another reason than the
/// last (another error variant), each with the count so far; the count
/// goes with the event that ends the run.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    count: u32,
    reason: Option<Discriminant<LockError>>,
}

impl Failures {
    /// Counts a failed round; whether the observer is to hear of it.
    pub(crate) fn failed(&mut self, error: &LockError) -> bool {
        self.count = self.count.saturating_add(1);
        let reason = Some(mem::discriminant(error));
        mem::replace(&mut self.reason, reason) != reason
    }

    /// The rounds failed in a row so far.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// A round succeeded: the run ends; returns how many had failed.
    pub(crate) fn end(&mut self) -> u32 {
        self.reason = None;
        mem::take(&mut self.count)
    }
}

impl Redlock {
    /// [`observe_counted`](Self::observe_counted) with no failed rounds.
    pub(crate) fn observe(
        &self,
        what: What,
        ids: (&[String], &Token),
        attempt: u32,
        outcome: Result<&Report, &LockError>,
    ) {
        self.observe_counted(Some(what), ids, (attempt, 0), outcome);
    }

    /// Tells the observer, if any, about a round on `resources` by
    /// `token`, the operation's attempt number and failed rounds so far
    /// being `counts`, that ended in `outcome`: first each node whose state
    /// changed (it failed after answering, or answered after failing) or
    /// that re-took the key, then the round's outcome as `what`, if the
    /// round is to be told. Every round the nodes answer comes here, told or
    /// not: the nodes' state is kept on all of them. A panic in the
    /// observer is caught.
    pub(crate) fn observe_counted(
        &self,
        what: Option<What>,
        (resources, token): (&[String], &Token),
        (attempt, failures): (u32, u32),
        outcome: Result<&Report, &LockError>,
    ) {
        let Some(Observer(observer)) = &self.config().observer else {
            return;
        };
        let (report, error) = outcome.map_or_else(|e| (e.report(), Some(e)), |r| (Some(r), None));
        let hex = token.hex();
        let event = Event {
            what: What::NodeFailed,
            resource: &resources[0],
            token: std::str::from_utf8(&hex[..8]).unwrap_or_default(),
            attempt,
            failures,
            elapsed: report.map_or(Duration::ZERO, |r| r.elapsed),
            node: None,
            node_outcome: None,
            error,
        };
        let tell = |event: &Event<'_>| drop(catch_unwind(AssertUnwindSafe(|| observer(event))));
        // A loss repeats the report of a round seen already.
        let report = report.filter(|_| what != Some(What::Lost));
        for (what, node, failures) in self.watch().changes(report.map_or(&[], |r| &r.nodes)) {
            tell(&Event {
                what,
                attempt: 0,
                failures,
                elapsed: node.elapsed,
                node: Some(&*node.node),
                node_outcome: Some(&node.outcome),
                error: None,
                ..event
            });
        }
        if let Some(what) = what {
            tell(&Event { what, ..event });
        }
    }
}

impl Watch {
    /// The nodes of a round whose state changed for the observer, with
    /// what to tell and the rounds they failed; and those that re-took
    /// the key.
    fn changes<'a>(&self, nodes: &'a [NodeReport]) -> Vec<(What, &'a NodeReport, u32)> {
        let mut down = lock(&self.down);
        if down.len() < nodes.len() {
            down.resize(nodes.len(), 0);
        }
        let mut changes = Vec::new();
        for (node, down) in nodes.iter().zip(down.iter_mut()) {
            let change = match node.outcome {
                NodeOutcome::TimedOut | NodeOutcome::Failed(_) => {
                    *down = down.saturating_add(1);
                    (*down == 1).then_some((What::NodeFailed, 1))
                }
                NodeOutcome::NotAwaited => None,
                _ => (*down > 0).then(|| (What::NodeRecovered, mem::take(down))),
            };
            changes.extend(change.map(|(what, n)| (what, node, n)));
            if node.retook {
                changes.push((What::Retook, node, 0));
            }
        }
        changes
    }
}
