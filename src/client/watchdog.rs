//! One watchdog thread per client keeps its guards alive, and one notifier
//! thread runs their loss callbacks.
//!
//! The watchdog starts with the first guard and holds the client weakly. It
//! exits when the client is dropped, or after [`IDLE`] with no guard. Each
//! round extends every guard due by then, up to [`MAX_BATCH`]
//! ([`Redlock::extend_all`]). So an extension starts at most one round after
//! it is due, however slow a node is. A failed extension is rescheduled,
//! never slept on.
//!
//! The notifier runs callbacks one at a time, each under `catch_unwind`.
//! None runs on the watchdog. A panic in a batch's round ends that batch's
//! leases, each told. A guard waits for its loss callbacks, except on these
//! two threads ([`Watchdog::may_wait`]): there, it would wait for itself.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use super::guard::Lease;
use super::observe::caught;
use super::{Inner, Redlock};
use crate::lock::Lock;
use crate::sync::lock;

/// How long the watchdog waits with no guard before it exits; the next
/// guard starts it again.
const IDLE: Duration = Duration::from_secs(30);

/// The most guards one round extends. A node runs a script whole before
/// anything else, so one call must stay short.
const MAX_BATCH: usize = 1024;

/// A callback to run on the notifier thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A client's watchdog and notifier: their schedule and queue, under one
/// lock.
#[derive(Default)]
pub(crate) struct Watchdog {
    schedule: Mutex<Schedule>,
    wake: Condvar,
}

/// A lease the watchdog keeps: when it is due next, the lease, and its lock
/// as the extensions measure it.
pub(crate) type Kept = (Instant, Arc<Lease>, Lock);

#[derive(Default)]
struct Schedule {
    /// Every lease the watchdog keeps.
    leases: Vec<Kept>,
    /// The watchdog thread, while it runs.
    watchdog: Option<ThreadId>,
    /// The client is gone: the watchdog exits, and the notifier once its
    /// queue is empty.
    closed: bool,
    /// The callbacks for the notifier, in order.
    notices: VecDeque<Job>,
    /// The notifier thread, while it runs.
    notifier: Option<ThreadId>,
}

impl Watchdog {
    /// Puts `entry` under the watchdog, and starts it if it does not run.
    pub(crate) fn add(self: &Arc<Self>, client: &Redlock, entry: Kept) -> std::io::Result<()> {
        let mut schedule = lock(&self.schedule);
        if schedule.watchdog.is_none() {
            let (watch, client) = (Arc::clone(self), Arc::downgrade(&client.inner));
            let named = thread::Builder::new().name("redlock-watchdog".into());
            let spawned = named.spawn(move || watch.run(&client))?;
            schedule.watchdog = Some(spawned.thread().id());
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

    /// Queues `job` for the notifier, and starts it if it does not run. If
    /// it cannot start, the job comes back: it never runs here.
    pub(crate) fn notify(self: &Arc<Self>, job: Job) -> Result<(), Job> {
        let mut schedule = lock(&self.schedule);
        if schedule.notifier.is_none() {
            let watch = Arc::clone(self);
            let named = thread::Builder::new().name("redlock-notifier".to_string());
            let spawned = named.spawn(move || watch.notifier());
            let Ok(spawned) = spawned else {
                return Err(job);
            };
            schedule.notifier = Some(spawned.thread().id());
        }
        schedule.notices.push_back(job);
        self.wake.notify_all();
        Ok(())
    }

    /// Whether this thread may wait for a queued job to run: it is neither
    /// the notifier nor the watchdog.
    pub(crate) fn may_wait(&self) -> bool {
        let schedule = lock(&self.schedule);
        let here = Some(thread::current().id());
        here != schedule.notifier && here != schedule.watchdog
    }

    /// The notifier: runs the queued jobs one at a time, catching panics. It
    /// exits once the client is gone and the queue is empty.
    fn notifier(&self) {
        loop {
            let waiting = |s: &mut Schedule| s.notices.is_empty() && !s.closed;
            let schedule = self.wake.wait_while(lock(&self.schedule), waiting);
            let mut schedule = schedule.unwrap_or_else(PoisonError::into_inner);
            let Some(job) = schedule.notices.pop_front() else {
                return schedule.notifier = None;
            };
            drop(schedule);
            let _ = caught(job);
        }
    }

    /// The watchdog: extends the due leases, and puts them back by their
    /// next due time.
    fn run(&self, weak: &Weak<Inner>) {
        // The client is upgraded for one turn at a time: while the
        // watchdog waits, it does not keep its client alive.
        while let (Some(batch), Some(inner)) = (self.next_batch(), weak.upgrade()) {
            let stepped = step_all(&Redlock { inner }, batch);
            lock(&self.schedule).leases.extend(stepped);
        }
    }

    /// Waits until some leases are due, and takes them out of the schedule.
    /// `None` once closed or idle: the watchdog exits.
    fn next_batch(&self) -> Option<Vec<Kept>> {
        let (mut schedule, mut idle) = (lock(&self.schedule), false);
        loop {
            let now = Instant::now();
            if schedule.closed || idle {
                schedule.watchdog = None;
                return None;
            }
            // Those left unvisited once the batch is full stay.
            let due = schedule.leases.extract_if(.., |(at, ..)| *at <= now);
            let due: Vec<_> = due.take(MAX_BATCH).collect();
            if !due.is_empty() {
                return Some(due);
            }
            let next = schedule.leases.iter().map(|(at, ..)| *at).min();
            let wait = next.map_or(IDLE, |at| at.saturating_duration_since(now));
            let waited = self.wake.wait_timeout(schedule, wait);
            let waited = waited.unwrap_or_else(PoisonError::into_inner);
            (idle, schedule) = (waited.1.timed_out() && waited.0.leases.is_empty(), waited.0);
        }
    }
}

/// Steps the leases of `batch`, extending in one round those that claim an
/// extension. Returns the leases that stay, by their next due time.
fn step_all(client: &Redlock, batch: Vec<Kept>) -> Vec<Kept> {
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
