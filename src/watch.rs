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
//! `catch_unwind`: a callback that blocks delays the callbacks after it,
//! never an extension. The notifier starts with the first callback and
//! exits when the client is dropped.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::client::{Redlock, WeakRedlock};
use crate::error::{LockError, NodeOutcome, Report};
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

/// A client's watchdog and notifier: their schedule and their queue.
#[derive(Default)]
pub(crate) struct Watch {
    schedule: Mutex<Schedule>,
    wake: Condvar,
    /// The notifier's queue, once it runs.
    notices: Mutex<Option<Sender<Job>>>,
}

/// A lease the watchdog keeps: when it is due next, the lease, and its
/// lock as the watchdog's extensions measure it.
pub(crate) type Entry = (Instant, Arc<Lease>, Lock);

#[derive(Default)]
struct Schedule {
    /// Every lease the watchdog keeps.
    leases: Vec<Entry>,
    running: bool,
    /// The client is gone: the watchdog exits.
    closed: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// Runs `job` on the notifier thread (started if need be), or here if
    /// no thread can be started. A panic in it is caught. The notifier
    /// lives as long as the client's watch.
    pub(crate) fn notify(&self, job: Job) {
        let mut notices = lock(&self.notices);
        if notices.is_none() {
            let (queue, jobs) = mpsc::channel::<Job>();
            let notifier = move || {
                jobs.into_iter()
                    .for_each(|job| drop(catch_unwind(AssertUnwindSafe(job))))
            };
            let named = std::thread::Builder::new().name("redlock-notifier".to_string());
            *notices = named.spawn(notifier).ok().map(|_| queue);
        }
        if let Some(Err(mpsc::SendError(job))) = notices.as_ref().map(|queue| queue.send(job)) {
            let _ = catch_unwind(AssertUnwindSafe(job));
        }
    }

    /// The watchdog: waits for the next due leases, steps them, puts them
    /// back with their next due time.
    fn run(&self, weak: &WeakRedlock) {
        // The client is upgraded for one turn at a time: while the
        // watchdog waits, it does not keep its client alive.
        while let (Some(batch), Some(client)) = (self.next_batch(), weak.upgrade()) {
            // A lease whose turn panicked is dropped.
            let stepped = catch_unwind(AssertUnwindSafe(|| step_all(&client, batch)));
            let stepped = stepped.unwrap_or_default();
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
fn step_all(client: &Redlock, batch: Vec<Entry>) -> Vec<Entry> {
    let (mut kept, mut claimed) = (Vec::new(), Vec::new());
    for (_, lease, lock) in batch {
        match lease.claim(client) {
            Ok(ttl) => claimed.push((lease, lock, ttl)),
            Err(due) => kept.extend(due.map(|due| (due, lease, lock))),
        }
    }
    let mut round: Vec<_> = claimed.iter_mut().map(|(_, l, ttl)| (l, *ttl)).collect();
    let results = client.extend_all(&mut round, 1);
    for ((lease, lock, ttl), result) in claimed.into_iter().zip(results) {
        let due = lease.extended(client, &lock, ttl, result);
        kept.extend(due.map(|due| (due, lease, lock)));
    }
    kept
}

/// What an [`Event`] reports.
///
/// ```
/// use redlock_sync::{Event, What};
///
/// fn is_trouble(event: &Event<'_>) -> bool {
///     matches!(event.what, What::NodeFailed | What::ExtendFailed | What::Lost)
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum What {
    /// An attempt won the lock.
    Acquired,
    /// An attempt found the lock held by another client.
    Contended,
    /// An attempt failed otherwise (too few nodes answered, too slow).
    AttemptFailed,
    /// A node failed or timed out in a round ([`Event::node`] says which).
    NodeFailed,
    /// An extension succeeded.
    Extended,
    /// In an extension, a node that had lost the key (a restart, an
    /// eviction) set it again ([`Event::node`] says which; see
    /// [`Redlock::extend`](crate::Redlock::extend)).
    Retook,
    /// An extension failed; a guard's watchdog retries it while validity
    /// is left, unless [`Event::error`] is [`LockError::Lost`].
    ExtendFailed,
    /// A guard's lock is lost (refused, or its validity ran out).
    Lost,
    /// A release round ended ([`Event::error`] says if it failed).
    Released,
}

/// Something the client did, for logs and metrics: what the builder's
/// [`observer`](crate::RedlockBuilder::observer) gets. It carries the
/// resource, the token's first 8 characters, the node's address where
/// there is one (never a password), timings and the outcome; never a
/// whole token. Its `Debug` output is fit for a log line.
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
#[derive(Debug, Clone, Copy)]
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
    /// How long the round took, or the node's part of it.
    pub elapsed: Duration,
    /// The node, for [`What::NodeFailed`] and [`What::Retook`].
    pub node: Option<&'a str>,
    /// What the node did, for [`What::NodeFailed`] and [`What::Retook`].
    pub node_outcome: Option<&'a NodeOutcome>,
    /// The error, for the events of a failure.
    pub error: Option<&'a LockError>,
}

/// The builder's observer.
#[derive(Clone)]
pub(crate) struct Observer(pub(crate) Arc<dyn Fn(&Event<'_>) + Send + Sync>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl Redlock {
    /// Tells the observer, if any, about a round of `what` on `resources`
    /// by `token` that ended in `outcome`: first each node that failed or
    /// re-took the key, then the round's outcome. A panic in the observer is caught.
    pub(crate) fn observe(
        &self,
        what: What,
        (resources, token): (&[String], &Token),
        attempt: u32,
        outcome: Result<&Report, &LockError>,
    ) {
        let Some(Observer(observer)) = &self.config().observer else {
            return;
        };
        let (report, error) = outcome.map_or_else(|e| (e.report(), Some(e)), |r| (Some(r), None));
        let hex = token.hex();
        let mut event = Event {
            what: What::NodeFailed,
            resource: &resources[0],
            token: std::str::from_utf8(&hex[..8]).unwrap_or_default(),
            attempt,
            elapsed: report.map_or(Duration::ZERO, |r| r.elapsed),
            node: None,
            node_outcome: None,
            error: None,
        };
        let tell = |event: &Event<'_>| drop(catch_unwind(AssertUnwindSafe(|| observer(event))));
        for node in report.iter().flat_map(|r| &r.nodes) {
            let failed = matches!(node.outcome, NodeOutcome::Failed(_) | NodeOutcome::TimedOut);
            if failed || node.retook {
                let mut told = event;
                told.what = [What::Retook, What::NodeFailed][usize::from(failed)];
                (told.node, told.node_outcome) = (Some(&*node.node), Some(&node.outcome));
                told.elapsed = node.elapsed;
                tell(&told);
            }
        }
        (event.what, event.error) = (what, error);
        tell(&event);
    }
}
