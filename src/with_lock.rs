//! Locks kept alive by a watchdog thread: [`LockGuard`], which
//! [`Redlock::lock`] returns and which releases the lock when dropped, and
//! [`Redlock::with_lock`], which runs a closure under such a guard.
//!
//! The watchdog is a thread of its own, holding the lease by `Arc` and a
//! clone of the client. It sleeps on a condition variable until the next
//! extension is due, and wakes at once when the guard is unlocked or
//! dropped; the guard joins it before the release round, so no extension
//! can land after the release. A guard that is never dropped
//! (`mem::forget`) leaves its watchdog extending the lock up to the hold
//! cap, or as long as the process lives.
//!
//! The guard's view of the lock is its validity deadline, under a mutex
//! the watchdog takes only to publish a round's outcome: it only moves
//! forward while the lock is held, and once lost (whoever first sees it
//! passed, the guard or the watchdog, marks it) it stays so; an extension
//! that ended after the deadline passed does not revive it.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::Redlock;
use crate::error::{LockError, Report};
use crate::kind::Kind;
use crate::lock::{Lock, Token};
use crate::request::{Call, IntoResources, LockOptions};

/// A lock held until the guard is dropped or [unlocked](Self::unlock),
/// and kept alive meanwhile by a watchdog thread: what [`Redlock::lock`]
/// returns, and what the closure of [`Redlock::with_lock`] gets.
///
/// The watchdog extends the lock each time only a share of its validity is
/// left ([`extend_when_left`](crate::RedlockBuilder::extend_when_left)),
/// up to the hold cap ([`max_hold`](crate::RedlockBuilder::max_hold)) if
/// one is set. The lock is lost as soon as an extension is refused (another
/// client holds it, or it expired on the nodes) or its validity deadline
/// passes (extensions kept failing, or the hold cap stopped them),
/// whichever comes first; from then on [`is_held`](Self::is_held) is false
/// and [`check`](Self::check) returns [`LockError::Lost`], for good. Both
/// are cheap (a mutex the watchdog holds only for a moment, and a read of the
/// monotonic clock): call them
/// before each step of the work.
///
/// Dropping the guard stops the watchdog and releases the lock, also on an
/// early return and while a panic unwinds; that release is best effort and
/// never panics (a release that fails leaves keys that expire within the
/// TTL). [`unlock`](Self::unlock) does the same and says how it went:
/// whether the lock was held throughout, and what the nodes answered.
/// Either waits for the watchdog to stop, which takes at most the
/// watchdog's round in progress (`io_timeout`).
///
/// ```no_run
/// # use redlock_sync::{LockError, Redlock};
/// # use std::time::Duration;
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// let guard = locks.lock("reindex", Duration::from_secs(10))?;
/// for batch in 0..100 {
///     guard.check()?; // stop at once if the lock was lost (the guard releases it)
///     println!("batch {batch} under {} ({:?} left)", guard.token(), guard.validity());
/// }
/// guard.unlock()?; // Err(Lost) if the lock was lost at any moment
/// # Ok::<(), LockError>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped: bind it to a name (not `_`) for as long as the work runs"]
pub struct LockGuard {
    lease: Arc<Lease>,
    client: Redlock,
    /// The watchdog, until the guard stops it; `None` once released.
    watchdog: Option<JoinHandle<()>>,
}

/// The lease as the guard and the watchdog share it: what it holds, and
/// its state under one lock.
struct Lease {
    /// No extension reaches past this.
    hold_deadline: Option<Instant>,
    kind: Kind,
    resources: Vec<String>,
    token: Token,
    fencing_token: Option<u64>,
    state: Mutex<State>,
    /// Wakes the watchdog when the guard is done.
    wake: Condvar,
}

/// The lease's state.
struct State {
    /// The validity deadline; `None` once the lock is lost, for good. It
    /// only moves forward, and only while it has not passed.
    deadline: Option<Instant>,
    /// The watchdog will not extend any more.
    ending: bool,
    /// What the nodes answered in the watchdog's last round (at first, in
    /// the acquisition's): the report of the lost-lock error.
    report: Report,
    /// The guard is done: the watchdog stops.
    done: bool,
}

impl Lease {
    fn new(lock: &Lock, hold_deadline: Option<Instant>) -> Lease {
        Lease {
            hold_deadline,
            kind: lock.kind,
            resources: lock.resources.clone(),
            token: lock.token,
            fencing_token: lock.fencing_token,
            state: Mutex::new(State {
                deadline: Some(lock.valid_until),
                // A cap the acquisition's validity already reaches leaves
                // no extension to come.
                ending: hold_deadline.is_some_and(|hold| hold <= lock.valid_until),
                report: lock.report.clone(),
                done: false,
            }),
            wake: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The validity deadline while the lock is held; marks the lock lost
    /// for good once its deadline has passed.
    fn deadline(&self) -> Option<Instant> {
        let mut state = self.state();
        state.deadline = state.deadline.filter(|&d| Instant::now() < d);
        state.deadline
    }

    fn held(&self) -> bool {
        self.deadline().is_some()
    }

    /// Publishes an extension's new deadline, if the lock is still held:
    /// an extension that ended after the old deadline passed does not
    /// revive the lock. Returns whether the lock is held and will be
    /// extended again.
    fn extended(&self, valid_until: Instant, report: &Report) -> bool {
        let mut state = self.state();
        state.report = report.clone();
        state.deadline = (state.deadline)
            .filter(|&d| Instant::now() < d)
            .map(|_| valid_until);
        state.deadline.is_some() && !state.ending
    }

    /// Takes in a failed extension's report; a refused one loses the lock.
    fn failed(&self, report: &Report, lost: bool) {
        let mut state = self.state();
        state.report = report.clone();
        if lost {
            state.deadline = None;
            state.ending = true;
        }
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            resource: self.resources[0].clone(),
            report: self.state().report.clone(),
        }
    }

    /// Tells the watchdog to stop, and wakes it.
    fn stop(&self) {
        self.state().done = true;
        self.wake.notify_all();
    }

    /// Sleeps until `until`, or until told to stop; returns false if told
    /// to stop.
    fn sleep_until(&self, until: Instant) -> bool {
        let mut state = self.state();
        while !state.done {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            state = (self.wake.wait_timeout(state, left))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        false
    }

    /// The watchdog: extends `lock` by `ttl` each time only the share
    /// `when_left` of its validity is left, until told to stop, the lock is
    /// lost, or the hold cap is reached. A refused extension loses the lock;
    /// a failed one (too few nodes answered) is retried after the retry
    /// policy's pause while validity is left.
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
        let mut failures = 0;
        while self.sleep_until(due) {
            let Some(deadline) = self.deadline() else {
                return;
            };
            let now = Instant::now();
            let mut this_ttl = ttl;
            if let Some(hold) = self.hold_deadline {
                let room = hold.saturating_duration_since(now);
                if room < ttl {
                    // The last extension: shortened to end at the cap.
                    self.state().ending = true;
                    if room <= deadline.saturating_duration_since(now) {
                        return;
                    }
                    this_ttl = room;
                }
            }
            match client.extend_call(lock, this_ttl, &Call::default()) {
                Ok(()) => {
                    failures = 0;
                    // The shortened TTL was measured before the round began:
                    // never let the validity run past the cap.
                    let valid_until = (self.hold_deadline)
                        .map_or(lock.valid_until(), |hold| hold.min(lock.valid_until()));
                    if !self.extended(valid_until, lock.report()) {
                        return;
                    }
                    due = next_due(lock.valid_until());
                }
                Err(LockError::Lost { report, .. }) => return self.failed(&report, true),
                // Only a shortened last TTL can be refused as an argument:
                // it was too short to extend anything.
                Err(LockError::Argument(_)) => return,
                Err(e) => {
                    if let Some(report) = e.report() {
                        self.failed(report, false);
                    }
                    // Never spin, even with a zero retry delay.
                    failures += 1;
                    let pause = client.config().retry.pause(failures);
                    due = (Instant::now().checked_add(pause.max(Duration::from_millis(1))))
                        .map_or(deadline, |t| t.min(deadline));
                }
            }
        }
    }
}

impl LockGuard {
    /// The resource held (the first one, for a lock over several).
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let guard = locks.lock("invoice:42", Duration::from_secs(10))?;
    /// assert_eq!(guard.resource(), "invoice:42");
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
    /// locks.with_lock(["a", "b"], Duration::from_secs(10), |guard| {
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

    /// The fencing token, for a lock of [`Kind::Fenced`]; `None` for every
    /// other lock. It stays the same across extensions. Pass it with every
    /// write to the protected resource, which refuses a write whose token is
    /// lower than the highest it has seen (see [`Kind`]).
    ///
    /// ```no_run
    /// # use redlock_sync::{Kind, LockError, LockOptions, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let fenced = LockOptions::new(Duration::from_secs(10)).kind(Kind::Fenced);
    /// locks.with_lock("ledger", fenced, |guard| {
    ///     let token = guard.fencing_token().expect("a fenced lock has a token");
    ///     guard.check()?;
    ///     // storage.write_if_token_at_least(token, ...);
    /// #   let _ = token;
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.lease.fencing_token
    }

    /// The kind of lock held.
    ///
    /// ```no_run
    /// # use redlock_sync::{Kind, LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let guard = locks.lock("invoice:42", Duration::from_secs(10))?;
    /// assert_eq!(guard.kind(), Kind::Plain);
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn kind(&self) -> Kind {
        self.lease.kind
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
        (self.lease.deadline()).map_or(Duration::ZERO, |d| {
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
        !self.lease.held() || self.lease.state().ending
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

    /// Stops the watchdog, releases the lock on every node, and says how
    /// it went. Dropping the guard does the same, quietly.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let guard = locks.lock("invoice:42", Duration::from_secs(10))?;
    /// // ... the work, checking guard.check()? before each step ...
    /// let report = guard.unlock()?;
    /// println!("released: {report}");
    /// # Ok::<(), LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - [`LockError::Lost`] if the lock was lost at any moment while the
    ///   guard held it (an extension was refused, or the validity ran out,
    ///   for instance past the hold cap), with the report of the watchdog's
    ///   last round; or if the release found it gone. The work done under
    ///   it may have overlapped another holder's. The release ran anyway,
    ///   and deleted only keys that still held this lock's token.
    /// - [`LockError::NoQuorum`] when too few nodes answered the release to
    ///   tell. The keys not deleted expire within the TTL.
    pub fn unlock(mut self) -> Result<Report, LockError> {
        self.finish()
            .unwrap_or_else(|| Err(self.lease.lost_error()))
    }

    /// Stops and joins the watchdog, then releases the lock: the first
    /// time only (`None` after that).
    fn finish(&mut self) -> Option<Result<Report, LockError>> {
        let watchdog = self.watchdog.take()?;
        // Held now means held all along: the deadline never moves forward
        // once passed.
        let held = self.lease.held();
        self.lease.stop();
        // Joined first: no extension can land after the release. A watchdog
        // that panicked extends no more, and the lease says the rest.
        let _ = watchdog.join();
        let lease = &*self.lease;
        let released = (self.client).release_token(lease.kind, &lease.resources, &lease.token);
        Some(if held {
            released
        } else {
            Err(lease.lost_error())
        })
    }
}

/// Stops the watchdog and releases the lock, unless
/// [`unlock`](LockGuard::unlock) did. Never panics: the release's outcome
/// is dropped.
impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("kind", &self.lease.kind)
            .field("resources", &self.lease.resources)
            .field("token", &self.lease.token)
            .field("fencing_token", &self.lease.fencing_token)
            .field("validity", &self.validity())
            .field("ending", &self.is_ending())
            .finish()
    }
}

impl Redlock {
    /// Acquires a lock as [`acquire`](Self::acquire) does (waiting per the
    /// options' patience) and returns a guard that keeps it alive with a
    /// watchdog thread and releases it when dropped: the form of
    /// [`with_lock`](Self::with_lock) for code that does not fit in a
    /// closure.
    ///
    /// Unlike the [`Lock`] of [`acquire`](Self::acquire), which is yours
    /// for its validity only and which you release, the guard's lock is
    /// extended by the TTL each time only a share of its validity is left
    /// ([`LockOptions::extend_when_left`], by default the client's
    /// [`extend_when_left`](crate::RedlockBuilder::extend_when_left)), for
    /// as long as the guard lives, up to the hold cap
    /// ([`LockOptions::max_hold`], by default the client's
    /// [`max_hold`](crate::RedlockBuilder::max_hold)); and it is released
    /// when the guard goes out of scope: at the end of the block, on an
    /// early return or `?`, while a panic unwinds. [`LockGuard::unlock`]
    /// releases it and tells whether it was held throughout. A cancel
    /// handle in the options ends the wait only: never the guard's
    /// watchdog.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_sync::{LockError, Redlock};
    ///
    /// fn rebuild_index(locks: &Redlock) -> Result<(), LockError> {
    ///     let guard = locks.lock("search-index", Duration::from_secs(10))?;
    ///     for shard in 0..64 {
    ///         guard.check()?; // lost: return, and the guard's drop releases
    ///         println!("rebuilding shard {shard}");
    ///     }
    ///     guard.unlock()?; // Err(Lost) if the lock was lost at any moment
    ///     Ok(())
    /// }
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// # rebuild_index(&locks)?;
    /// # Ok::<(), LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - As [`acquire`](Self::acquire), and [`LockError::Argument`] for an
    ///   `extend_when_left` outside `(0, 1)`.
    /// - [`LockError::Lost`] if the validity ran out before the guard could
    ///   be made (the lock is released).
    /// - [`LockError::Thread`] if the OS cannot start the watchdog thread
    ///   (the lock is released).
    pub fn lock(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
    ) -> Result<LockGuard, LockError> {
        self.keep_alive(resources.into_resources(), &options.into(), false)
    }

    /// Like [`lock`](Self::lock), but one attempt only, as
    /// [`try_acquire`](Self::try_acquire): no retry.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// match locks.try_lock("report", Duration::from_secs(30)) {
    ///     Ok(guard) => { /* do the work */ guard.unlock()?; }
    ///     Err(LockError::Contended { .. }) => println!("someone else is on it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    pub fn try_lock(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
    ) -> Result<LockGuard, LockError> {
        self.keep_alive(resources.into_resources(), &options.into(), true)
    }

    /// Acquires a lock as [`lock`](Self::lock) does, runs `f` under it
    /// while the guard's watchdog keeps extending it, and always releases
    /// it afterwards: when `f` returns `Ok` or `Err`, and when it panics
    /// (the lock is released as the panic unwinds).
    ///
    /// So `f` may run far longer than the TTL, up to the hold cap if one is
    /// set. `f` gets the [`LockGuard`]: check
    /// [`is_held`](LockGuard::is_held) or [`check`](LockGuard::check)
    /// before each step of the work. The error type only needs
    /// `From<LockError>`, so `?` works on both the lock's errors and your
    /// own. A cancel handle in the options ends the wait for the lock only,
    /// never `f`.
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
    /// - Whatever [`lock`](Self::lock) returns; `f` does not run then. Nor
    ///   does it run if the validity ran out before it could start
    ///   ([`LockError::Lost`]).
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
    /// the TTL.
    ///
    /// # Panics
    ///
    /// Only if `f` panics: the lock is released as the panic unwinds (with
    /// `panic = "abort"`, the keys expire within the TTL instead).
    pub fn with_lock<T, E, F>(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
        f: F,
    ) -> Result<T, E>
    where
        F: FnOnce(&LockGuard) -> Result<T, E>,
        E: From<LockError>,
    {
        run_locked(self.lock(resources, options), f)
    }

    /// Like [`with_lock`](Self::with_lock), but one attempt only, as
    /// [`try_acquire`](Self::try_acquire): no retry, so it returns at once
    /// when another client holds the lock.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use redlock_sync::{LockError, Redlock};
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// match locks.try_with_lock("job:17", Duration::from_secs(10), |guard| {
    ///     guard.check()?;
    ///     Ok::<_, LockError>("done") // run job 17
    /// }) {
    ///     Ok(outcome) => println!("job 17: {outcome}"),
    ///     Err(LockError::Contended { .. }) => println!("another worker has job 17"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock).
    ///
    /// # Panics
    ///
    /// Only if `f` panics, after releasing the lock.
    pub fn try_with_lock<T, E, F>(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
        f: F,
    ) -> Result<T, E>
    where
        F: FnOnce(&LockGuard) -> Result<T, E>,
        E: From<LockError>,
    {
        run_locked(self.try_lock(resources, options), f)
    }

    /// Acquires as `options` say (one attempt if `once`), and puts the lock
    /// under a guard whose watchdog extends it by the TTL: `lock` and
    /// `try_lock`.
    fn keep_alive(
        &self,
        resources: Vec<String>,
        options: &LockOptions,
        once: bool,
    ) -> Result<LockGuard, LockError> {
        let (lock, call) = self.acquire_with(resources, options, once)?;
        let hold_deadline = call
            .max_hold
            .and_then(|cap| Instant::now().checked_add(cap));
        let lease = Arc::new(Lease::new(&lock, hold_deadline));
        if !lease.held() {
            // Out of validity already: no guard.
            let _ = self.release(lock);
            return Err(lease.lost_error());
        }
        let spawned = {
            let (lease, client, mut lock) = (Arc::clone(&lease), self.clone(), lock);
            let ttl = options.ttl;
            std::thread::Builder::new()
                .name("redlock-watchdog".to_string())
                .spawn(move || lease.watch(&client, &mut lock, ttl, call.extend_when_left))
        };
        match spawned {
            Ok(watchdog) => Ok(LockGuard {
                lease,
                client: self.clone(),
                watchdog: Some(watchdog),
            }),
            Err(e) => {
                let _ = self.release_token(lease.kind, &lease.resources, &lease.token);
                Err(LockError::Thread(e))
            }
        }
    }
}

/// Runs `f` under the guard that `locked` holds, then releases the lock:
/// the body of every `with_lock*` call. `f`'s error comes first; then a
/// lock lost at any moment; a release that reached too few nodes is not an
/// error (the work was done under a valid lock).
fn run_locked<T, E, F>(locked: Result<LockGuard, LockError>, f: F) -> Result<T, E>
where
    F: FnOnce(&LockGuard) -> Result<T, E>,
    E: From<LockError>,
{
    let guard = locked?;
    // A panic in `f` unwinds through the guard's drop, which releases.
    let value = f(&guard);
    let released = guard.unlock();
    let value = value?;
    match released {
        Err(lost @ LockError::Lost { .. }) => Err(lost.into()),
        _ => Ok(value),
    }
}
