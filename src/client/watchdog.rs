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
//! release starts (see `guard.rs`). (A round, the watchdog's as any
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
//! turn it was if it panics (see `guard.rs`); a panic in the round
//! that extends a batch ends the leases of that batch, each told, none
//! dropped silently. The observer is called under `catch_unwind`.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::guard::Lease;
use super::observe::caught;
use super::{Redlock, WeakRedlock};
use crate::lock::Lock;

/// How long the watchdog waits with no guard before it exits; the next
/// guard starts it again.
const IDLE: Duration = Duration::from_secs(30);

/// The most guards one round extends, so that one script call stays short
/// on the nodes (each node runs it whole before anything else).
const MAX_BATCH: usize = 1024;

/// A callback to run on the notifier thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A client's watchdog and notifier: their schedule and queue, under one
/// lock and one condition variable.
#[derive(Default)]
pub(crate) struct Watchdog {
    schedule: Mutex<Schedule>,
    wake: Condvar,
}

/// A lease the watchdog keeps: when it is due next, the lease, and its
/// lock as the watchdog's extensions measure it.
pub(crate) type Kept = (Instant, Arc<Lease>, Lock);

#[derive(Default)]
struct Schedule {
    /// Every lease the watchdog keeps.
    leases: Vec<Kept>,
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

impl Watchdog {
    /// Puts `entry` under the watchdog of `client`; starts the watchdog if
    /// it does not run.
    pub(crate) fn add(self: &Arc<Self>, client: &Redlock, entry: Kept) -> std::io::Result<()> {
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
    fn next_batch(&self) -> Option<Vec<Kept>> {
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
