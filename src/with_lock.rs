//! `with_lock`: a closure run under a lock that a watchdog thread keeps
//! alive, and the [`LockGuard`] the closure gets.
//!
//! The watchdog is a scoped thread (`std::thread::scope`), so it cannot
//! outlive `with_lock`. It sleeps on a condition variable until the next
//! extension is due, and wakes at once when the closure ends; it is joined
//! before the release round, so no extension can land after the release.
//!
//! The guard's view of the lock is one atomic: the validity deadline in
//! nanoseconds since a base instant, or [`LOST`]. It only moves forward
//! while the lock is held, and once it is `LOST` it stays so: whoever first
//! sees the deadline passed (the guard or the watchdog) swaps it for `LOST`,
//! and the watchdog publishes an extension only by swapping the deadline it
//! saw, before that deadline, for the new one.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::client::{resource_list, Redlock};
use crate::error::{LockError, Report};
use crate::lock::{Lock, Token};

/// The deadline value that means the lock is lost, for good.
const LOST: u64 = 0;

/// What a closure run by [`Redlock::with_lock`] gets: the lock's resources
/// and token, how much validity is left, and whether it is still held.
///
/// The lock stays held while the watchdog extends it. It is lost as soon
/// as an extension is refused (another client holds it, or it expired on
/// the nodes) or its validity deadline passes (extensions kept failing,
/// or the hold cap stopped them), whichever comes first; from then on
/// [`is_held`](Self::is_held) is false and [`check`](Self::check) returns
/// [`LockError::Lost`], for good. Both are cheap (an atomic load and a
/// read of the monotonic clock): call them before each step of the work.
///
/// ```no_run
/// # use redlock_sync::{LockError, Redlock};
/// # use std::time::Duration;
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// locks.with_lock("reindex", Duration::from_secs(10), |guard| {
///     for batch in 0..100 {
///         guard.check()?; // stop at once if the lock was lost
///         println!("batch {batch} under {} ({:?} left)", guard.token(), guard.validity());
///     }
///     Ok::<(), LockError>(())
/// })?;
/// # Ok::<(), LockError>(())
/// ```
pub struct LockGuard<'a> {
    lease: &'a Lease,
}

/// The lease as the guard and the watchdog share it: its validity
/// deadline, whether it will be extended again, and how to stop the
/// watchdog.
struct Lease {
    /// The instant `deadline` counts from.
    base: Instant,
    /// The validity deadline, in nanoseconds since `base` (at least 1), or
    /// [`LOST`].
    deadline: AtomicU64,
    /// The watchdog will not extend any more.
    ending: AtomicBool,
    /// No extension reaches past this.
    hold_deadline: Option<Instant>,
    resources: Vec<String>,
    token: Token,
    /// What the nodes answered in the watchdog's last round (at first, in
    /// the acquisition's): the report of the lost-lock error.
    report: Mutex<Report>,
    /// Set when the closure has ended: the watchdog stops.
    done: Mutex<bool>,
    wake: Condvar,
}

impl Lease {
    fn new(lock: &Lock, hold_deadline: Option<Instant>) -> Lease {
        // A cap the acquisition's validity already reaches leaves no
        // extension to come.
        let capped = hold_deadline.is_some_and(|hold| hold <= lock.valid_until);
        let lease = Lease {
            base: Instant::now(),
            deadline: AtomicU64::new(LOST),
            ending: AtomicBool::new(capped),
            hold_deadline,
            resources: lock.resources.clone(),
            token: lock.token,
            report: Mutex::new(lock.report.clone()),
            done: Mutex::new(false),
            wake: Condvar::new(),
        };
        let first = lease.nanos(lock.valid_until).max(1);
        lease.deadline.store(first, Ordering::Release);
        lease
    }

    /// `t` in nanoseconds since `base` (0 for earlier instants).
    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The validity deadline, unless the lock is lost. It may be past: see
    /// [`held`](Self::held).
    fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Acquire) {
            LOST => None,
            nanos => self.base.checked_add(Duration::from_nanos(nanos)),
        }
    }

    /// Whether the lock is held now; marks it lost for good if its deadline
    /// has passed.
    fn held(&self) -> bool {
        let now = self.nanos(Instant::now());
        loop {
            let deadline = self.deadline.load(Ordering::Acquire);
            if deadline == LOST {
                return false;
            }
            if now < deadline {
                return true;
            }
            if self
                .deadline
                .compare_exchange(deadline, LOST, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return false;
            }
        }
    }

    /// Publishes an extension's new deadline, if the lock is still held:
    /// an extension that ended after the old deadline passed does not
    /// revive the lock. Returns whether the lock is held.
    fn extended(&self, valid_until: Instant) -> bool {
        let new = self.nanos(valid_until).max(1);
        let now = self.nanos(Instant::now());
        loop {
            let old = self.deadline.load(Ordering::Acquire);
            if old == LOST {
                return false;
            }
            let next = if now < old { new } else { LOST };
            if self
                .deadline
                .compare_exchange(old, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return next != LOST;
            }
        }
    }

    fn mark_lost(&self) {
        self.deadline.store(LOST, Ordering::Release);
        self.ending.store(true, Ordering::Release);
    }

    fn set_report(&self, report: &Report) {
        *self.report.lock().unwrap_or_else(PoisonError::into_inner) = report.clone();
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            resource: self.resources[0].clone(),
            report: self
                .report
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    /// Tells the watchdog to stop, and wakes it.
    fn stop(&self) {
        *self.done.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.wake.notify_all();
    }

    /// Sleeps until `until`, or until told to stop; returns false if told
    /// to stop.
    fn sleep_until(&self, until: Instant) -> bool {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if *done {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            done = match self.wake.wait_timeout(done, until - now) {
                Ok((done, _)) => done,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// The watchdog: extends `lock` by `ttl` each time only the share
    /// `when_left` of its validity is left, until told to stop, the lock is
    /// lost, or the hold cap is reached. A refused extension loses the lock;
    /// a failed one (too few nodes answered) is retried after the retry
    /// pause while validity is left.
    fn watch(&self, client: &Redlock, lock: &mut Lock, ttl: Duration, when_left: f64) {
        // Measured on the validity each round leaves, not on the TTL: the
        // next extension is always some time away, whatever the fraction
        // and the drift term.
        let next_due = |valid_until: Instant| {
            let now = Instant::now();
            let validity = valid_until.saturating_duration_since(now);
            now.checked_add(validity.mul_f64(1.0 - when_left))
                .unwrap_or(valid_until)
        };
        let mut due = next_due(lock.valid_until());
        loop {
            if !self.sleep_until(due) || !self.held() {
                return;
            }
            let Some(deadline) = self.deadline() else {
                return;
            };
            let now = Instant::now();
            let mut this_ttl = ttl;
            if let Some(hold) = self.hold_deadline {
                let room = hold.saturating_duration_since(now);
                if room < ttl {
                    // The last extension: shortened to end at the cap.
                    self.ending.store(true, Ordering::Release);
                    if room <= deadline.saturating_duration_since(now) {
                        return;
                    }
                    this_ttl = room;
                }
            }
            match client.extend_retrying(lock, this_ttl, 0) {
                Ok(()) => {
                    self.set_report(lock.report());
                    // The shortened TTL was measured before the round began:
                    // never let the validity run past the cap.
                    let valid_until = self
                        .hold_deadline
                        .map_or(lock.valid_until(), |hold| hold.min(lock.valid_until()));
                    if !self.extended(valid_until) || self.ending.load(Ordering::Acquire) {
                        return;
                    }
                    due = next_due(lock.valid_until());
                }
                Err(LockError::Lost { report, .. }) => {
                    self.set_report(&report);
                    self.mark_lost();
                    return;
                }
                // Only a shortened last TTL can be refused as an argument:
                // it was too short to extend anything.
                Err(LockError::Argument(_)) => return,
                Err(e) => {
                    if let Some(report) = e.report() {
                        self.set_report(report);
                    }
                    // Never spin, even with a zero retry delay.
                    let pause = client
                        .retry_pause()
                        .unwrap_or(client.config().retry_delay)
                        .max(Duration::from_millis(1));
                    due = Instant::now()
                        .checked_add(pause)
                        .map_or(deadline, |t| t.min(deadline));
                }
            }
        }
    }
}

impl LockGuard<'_> {
    /// The resource held (the first one, for a lock over several).
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.with_lock("invoice:42", Duration::from_secs(10), |guard| {
    ///     assert_eq!(guard.resource(), "invoice:42");
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn resource(&self) -> &str {
        &self.lease.resources[0]
    }

    /// Every resource held, in the order given.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.with_lock_many(["a", "b"], Duration::from_secs(10), |guard| {
    ///     assert_eq!(guard.resources(), ["a", "b"]);
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn resources(&self) -> &[String] {
        &self.lease.resources
    }

    /// The token that proves ownership (it does not change when the lock
    /// is extended).
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.with_lock("invoice:42", Duration::from_secs(10), |guard| {
    ///     println!("holding with token {}", guard.token());
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn token(&self) -> &Token {
        &self.lease.token
    }

    /// How long the lock is still valid, by the monotonic clock, as of the
    /// last extension; zero once it is lost.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.with_lock("invoice:42", Duration::from_secs(10), |guard| {
    ///     assert!(guard.validity() > Duration::from_secs(9));
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn validity(&self) -> Duration {
        if !self.lease.held() {
            return Duration::ZERO;
        }
        self.lease.deadline().map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }

    /// Whether the lock is still held: false, for good, as soon as an
    /// extension was refused or the validity deadline passed.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.with_lock("invoice:42", Duration::from_secs(10), |guard| {
    ///     while guard.is_held() {
    ///         // one small step of the work
    /// #       break;
    ///     }
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn is_held(&self) -> bool {
        self.lease.held()
    }

    /// `Ok(())` while the lock is held, else the lost-lock error: the
    /// `?`-friendly form of [`is_held`](Self::is_held).
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.with_lock("invoice:42", Duration::from_secs(10), |guard| {
    ///     guard.check()?;
    ///     // write, knowing the lock was held a moment ago
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] once the lock is lost, with the report of the
    /// watchdog's last round (the refused or failed extension, if there
    /// was one).
    pub fn check(&self) -> Result<(), LockError> {
        if self.lease.held() {
            Ok(())
        } else {
            Err(self.lease.lost_error())
        }
    }

    /// Whether the lock will not be extended any more: its validity
    /// reaches the hold cap ([`max_hold`](crate::RedlockBuilder::max_hold)),
    /// from the acquisition on if the cap is shorter than the TTL, or the
    /// lock is lost. It may still be held: [`validity`](Self::validity)
    /// says for how long. Wind the work down.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::builder(["redis://127.0.0.1:7001"]).max_hold(Duration::from_secs(60)).build()?;
    /// locks.with_lock("crawl", Duration::from_secs(10), |guard| {
    ///     while !guard.is_ending() {
    ///         guard.check()?;
    ///         // crawl one more page
    /// #       break;
    ///     }
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn is_ending(&self) -> bool {
        self.lease.ending.load(Ordering::Acquire) || !self.lease.held()
    }

    /// The instant (monotonic clock) past which the lock is never extended,
    /// if a hold cap is set: the acquisition plus
    /// [`max_hold`](crate::RedlockBuilder::max_hold).
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::builder(["redis://127.0.0.1:7001"]).max_hold(Duration::from_secs(60)).build()?;
    /// locks.with_lock("crawl", Duration::from_secs(10), |guard| {
    ///     assert!(guard.hold_deadline().is_some());
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn hold_deadline(&self) -> Option<Instant> {
        self.lease.hold_deadline
    }
}

impl fmt::Debug for LockGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("resources", &self.lease.resources)
            .field("token", &self.lease.token)
            .field("validity", &self.validity())
            .field("ending", &self.is_ending())
            .finish()
    }
}

impl Redlock {
    /// Acquires a lock on `resource` for `ttl` (with the retry policy and
    /// wait budget of [`acquire`](Self::acquire)), runs `f` under it while a
    /// watchdog thread keeps extending it, and always releases it
    /// afterwards: when `f` returns `Ok` or `Err`, and when it panics (the
    /// panic then resumes after the release).
    ///
    /// The watchdog extends the lock by `ttl` each time only a share of its
    /// validity is left ([`extend_when_left`](crate::RedlockBuilder::extend_when_left),
    /// default 1/3), so `f` may run far longer than `ttl`, up to the hold
    /// cap ([`max_hold`](crate::RedlockBuilder::max_hold)) if one is set. `f` gets
    /// a [`LockGuard`]: check [`is_held`](LockGuard::is_held) or
    /// [`check`](LockGuard::check) before each step of the work. The error
    /// type only needs `From<LockError>`, so `?` works on both the lock's
    /// errors and your own.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_sync::{LockError, Redlock};
    ///
    /// #[derive(Debug)]
    /// enum JobError {
    ///     Lock(LockError),
    ///     Invalid(String),
    /// }
    /// impl From<LockError> for JobError {
    ///     fn from(e: LockError) -> Self { JobError::Lock(e) }
    /// }
    ///
    /// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .map_err(JobError::Lock)?;
    /// let total = locks.with_lock("nightly-report", Duration::from_secs(10), |guard| {
    ///     let mut total = 0;
    ///     for chunk in 0..1_000 {
    ///         guard.check()?; // the lock may be lost: stop writing at once
    ///         if chunk > 10_000 { return Err(JobError::Invalid(format!("chunk {chunk}"))); }
    ///         total += chunk;
    ///     }
    ///     Ok(total)
    /// })?;
    /// println!("total {total}, computed under an exclusive lock the whole time");
    /// # Ok::<(), JobError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - Whatever acquiring returns (see [`acquire`](Self::acquire)); `f`
    ///   does not run then. Nor does it run if the validity ran out before
    ///   it could start ([`LockError::Lost`]).
    /// - `f`'s own error, if it returned one. It comes first, even if the
    ///   lock was also lost, because it says why the work stopped (often it
    ///   is the lost-lock error from [`check`](LockGuard::check)), and the
    ///   work is not reported as done either way.
    /// - [`LockError::Lost`] if `f` returned `Ok` but the lock was lost at
    ///   some moment while it ran (an extension was refused, or the validity
    ///   ran out, for instance past the hold cap), or the release found it
    ///   gone. `f`'s value is dropped: the work may have overlapped another
    ///   holder's, and must not be reported as done under the lock.
    ///
    /// A release that reaches too few nodes is not an error: the work was
    /// done under a valid lock, and the keys left behind expire within
    /// `ttl`.
    ///
    /// # Panics
    ///
    /// Only if `f` panics: the lock is released first, then the panic
    /// resumes.
    pub fn with_lock<T, E, F>(&self, resource: &str, ttl: Duration, f: F) -> Result<T, E>
    where
        F: FnOnce(&LockGuard<'_>) -> Result<T, E>,
        E: From<LockError>,
    {
        self.lock_and_run(vec![resource.to_string()], ttl, f)
    }

    /// [`with_lock`](Self::with_lock) over several resources held as one
    /// lock, all or nothing, as [`acquire_many`](Self::acquire_many) takes
    /// them; they are extended and released together.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use redlock_sync::{LockError, Redlock};
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// // Move credit between two accounts, holding both.
    /// locks.with_lock_many(["account:alice", "account:bob"], Duration::from_secs(5), |guard| {
    ///     guard.check()?;
    ///     // debit alice, credit bob
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock), and [`LockError::Argument`] for no
    /// resources, an empty resource name, or a resource named twice.
    ///
    /// # Panics
    ///
    /// Only if `f` panics, after releasing the lock.
    pub fn with_lock_many<I, S, T, E, F>(&self, resources: I, ttl: Duration, f: F) -> Result<T, E>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
        F: FnOnce(&LockGuard<'_>) -> Result<T, E>,
        E: From<LockError>,
    {
        self.lock_and_run(resource_list(resources), ttl, f)
    }

    /// Acquires one lock over `resources`, runs `f` under it while the
    /// watchdog extends it, and releases it: the body of
    /// [`with_lock`](Self::with_lock) and
    /// [`with_lock_many`](Self::with_lock_many).
    fn lock_and_run<T, E, F>(&self, resources: Vec<String>, ttl: Duration, f: F) -> Result<T, E>
    where
        F: FnOnce(&LockGuard<'_>) -> Result<T, E>,
        E: From<LockError>,
    {
        let config = *self.config();
        let mut lock = self.acquire_retrying(resources, ttl, config.retry_count)?;
        let hold_deadline = config
            .max_hold
            .and_then(|cap| Instant::now().checked_add(cap));
        let lease = Lease::new(&lock, hold_deadline);
        if !lease.held() {
            // Out of validity already: the closure does not start.
            let _ = self.release(lock);
            return Err(lease.lost_error().into());
        }

        let scoped = std::thread::scope(|s| {
            let watchdog = std::thread::Builder::new()
                .name("redlock-watchdog".to_string())
                .spawn_scoped(s, || {
                    lease.watch(self, &mut lock, ttl, config.extend_when_left)
                })?;
            let guard = LockGuard { lease: &lease };
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| f(&guard)));
            // Held now means held all along: the deadline never moves
            // forward once passed.
            let held = lease.held();
            lease.stop();
            Ok((outcome, held, watchdog.join()))
        });
        let (outcome, held, watchdog) = match scoped {
            Ok(ran) => ran,
            // No thread for the watchdog: the closure did not run.
            Err(e) => {
                let _ = self.release(lock);
                return Err(LockError::Thread(e).into());
            }
        };
        // The watchdog is joined: no extension can land after this release.
        let released = self.release(lock);

        let value = match outcome {
            Err(panic) => panic::resume_unwind(panic),
            Ok(result) => result?,
        };
        if let Err(panic) = watchdog {
            panic::resume_unwind(panic);
        }
        if !held {
            return Err(lease.lost_error().into());
        }
        match released {
            Err(lost @ LockError::Lost { .. }) => Err(lost.into()),
            _ => Ok(value),
        }
    }
}
