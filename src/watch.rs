//! One watchdog thread per client, which keeps every guard of that client
//! alive, and one notifier thread, which runs the guards' loss callbacks.
//!
//! The watchdog starts with the first guard, holds the client weakly (the
//! guards hold it strongly), and exits when the client is dropped or after
//! [`IDLE`] with no guard. It sleeps until the earliest due extension; each
//! guard's lease says when it is due next ([`Lease::step`]). Extensions that
//! fall due together run one after the other on the watchdog while that
//! is quick; once a batch has taken half an `io_timeout` (its rounds are
//! slow), the rest runs side by side on at most [`WORKERS`] threads (the
//! watchdog and short-lived scoped helpers), so slow rounds delay the
//! others by about one round, not one round each. A failed extension is retried by the
//! schedule, never by sleeping on the watchdog.
//!
//! Loss callbacks run on the notifier thread, one at a time, each under
//! `catch_unwind`: a callback that blocks delays the callbacks after it,
//! never an extension. The notifier starts with the first callback and
//! exits when the client is dropped.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::client::{Redlock, WeakRedlock};
use crate::retry::later;
use crate::with_lock::Lease;

/// How long the watchdog waits with no guard before it exits; the next
/// guard starts it again.
const IDLE: Duration = Duration::from_secs(30);

/// The most threads that run one batch of due extensions, the watchdog
/// included.
const WORKERS: usize = 4;

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

#[derive(Default)]
struct Schedule {
    /// Every lease the watchdog keeps, and when it is due next.
    leases: Vec<(Instant, Arc<Lease>)>,
    running: bool,
    /// The client is gone: the watchdog exits.
    closed: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Watch {
    /// Puts `lease` under the watchdog of `client`, due at `due`; starts
    /// the watchdog if it does not run.
    pub(crate) fn add(
        self: &Arc<Self>,
        client: &Redlock,
        lease: Arc<Lease>,
        due: Instant,
    ) -> std::io::Result<()> {
        let mut schedule = lock(&self.schedule);
        if !schedule.running {
            let (watch, client) = (Arc::clone(self), client.downgrade());
            std::thread::Builder::new()
                .name("redlock-watchdog".to_string())
                .spawn(move || watch.run(&client))?;
            schedule.running = true;
        }
        schedule.leases.push((due, lease));
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
    fn run(&self, client: &WeakRedlock) {
        loop {
            let Some(batch) = self.next_batch() else {
                return;
            };
            let Some(client) = client.upgrade() else {
                return;
            };
            let stepped = step_all(&client, batch);
            drop(client);
            let mut schedule = lock(&self.schedule);
            schedule.leases.extend(stepped);
        }
    }

    /// Waits until some leases are due, and takes them out of the
    /// schedule; `None` once closed or idle (the watchdog exits).
    fn next_batch(&self) -> Option<Vec<Arc<Lease>>> {
        let mut schedule = lock(&self.schedule);
        loop {
            let now = Instant::now();
            if schedule.closed {
                schedule.running = false;
                return None;
            }
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut schedule.leases)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            schedule.leases = later;
            if !due.is_empty() {
                return Some(due.into_iter().map(|(_, lease)| lease).collect());
            }
            let next = schedule.leases.iter().map(|(at, _)| *at).min();
            let wait = next.map_or(IDLE, |at| at.saturating_duration_since(now));
            let (guard, timeout) = (self.wake)
                .wait_timeout(schedule, wait)
                .unwrap_or_else(PoisonError::into_inner);
            schedule = guard;
            if timeout.timed_out() && schedule.leases.is_empty() {
                schedule.running = false;
                return None;
            }
        }
    }
}

/// Steps every lease of `batch`, on the watchdog alone while that is
/// quick, side by side on up to [`WORKERS`] threads once the batch has
/// taken half an `io_timeout` (rounds are slow); returns the leases that
/// stay, with their next due time.
fn step_all(client: &Redlock, batch: Vec<Arc<Lease>>) -> Vec<(Instant, Arc<Lease>)> {
    let next = AtomicUsize::new(0);
    let slow = later(Instant::now(), client.config().io_timeout / 2);
    let work = |alone: bool| {
        let mut kept = Vec::new();
        while let Some(lease) = batch.get(next.fetch_add(1, Ordering::Relaxed)) {
            kept.extend(lease.step(client).map(|due| (due, Arc::clone(lease))));
            if alone && Instant::now() >= slow {
                break;
            }
        }
        kept
    };
    let mut kept = work(true);
    if next.load(Ordering::Relaxed) < batch.len() {
        std::thread::scope(|s| {
            let helpers: Vec<_> = (1..WORKERS)
                .filter_map(|_| {
                    (std::thread::Builder::new().name("redlock-watchdog".to_string()))
                        .spawn_scoped(s, move || work(false))
                        .ok()
                })
                .collect();
            kept.extend(work(false));
            for helper in helpers {
                kept.extend(helper.join().unwrap_or_default());
            }
        });
    }
    kept
}
