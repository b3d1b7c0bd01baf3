//! [`LockGuard`], [`Redlock::lock`] and [`Redlock::with_lock`]: locks that
//! the client's watchdog keeps alive.
//!
//! A guard shares its [`Lease`] with the watchdog (`watchdog.rs`). Under
//! the lease's mutex:
//!
//! - The validity deadline only moves forward, and only while it has not
//!   passed. Once lost, a lease stays lost.
//! - The guard marks itself done and waits for an extension in flight. A
//!   done lease gets no extension, so none is written after the release
//!   starts.
//! - The loss is told once: for a lock lost before its guard is done. A
//!   guard released while held tells nothing, ever.
//! - `pending` counts the callbacks taken to run but not returned yet.
//!   After a loss, `wait_lost` and a guard's release wait until it is told
//!   and `pending` is zero, except on the notifier and the watchdog: they
//!   would wait for themselves.
//!
//! The backoff runs under `catch_unwind`. Its panic ends that lease alone,
//! as a loss ([`LockError::Panicked`]), and releases its lock.

use std::fmt;
use std::mem;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::config::Call;
use super::observe::{caught, Failures};
use super::Redlock;
use crate::error::{LockError, Loss, Report};
use crate::event::What;
use crate::kind::Kind;
use crate::lock::{IntoResources, Lock};
use crate::request::{LockOptions, Patience};
use crate::retry::Retries;
use crate::sync::lock;
use crate::time::{later, Ttl};
use crate::token::Token;

/// A loss callback ([`LockGuard::on_lost`]).
type OnLost = Box<dyn FnOnce(&LockError) + Send>;

/// A lock that the client's watchdog keeps alive until the guard is
/// dropped or [unlocked](Self::unlock).
///
/// [`Redlock::lock`] returns one, and the closure of
/// [`Redlock::with_lock`] gets one. The watchdog extends the lock each time
/// a share of its validity is left
/// ([`extend_when_left`](crate::RedlockBuilder::extend_when_left)). It
/// stops at the hold cap ([`max_hold`](crate::RedlockBuilder::max_hold)).
/// The lock is lost once an extension is refused or the validity runs out.
/// From then on [`is_held`](Self::is_held) is false and
/// [`check`](Self::check) fails, for good. Both are cheap: call them before
/// each step of the work.
///
/// Dropping the guard releases the lock, also on `?` and while a panic
/// unwinds. That release never panics, and keys it misses expire within
/// the TTL. [`unlock`](Self::unlock) also says how the release went. Both
/// wait for an extension in flight: at most one round. After a loss, both
/// wait for its [`on_lost`](Self::on_lost) callbacks.
///
/// A failed extension is retried while validity is left. The pause is the
/// retry policy's, or half the validity left if that is shorter. A guard
/// that is never dropped (`mem::forget`) is extended up to the hold cap, or
/// while the client lives.
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
}

/// What a guard and the watchdog share.
pub(crate) struct Lease {
    /// No extension reaches past this.
    hold_deadline: Option<Instant>,
    kind: Kind,
    resources: Vec<String>,
    token: Token,
    fencing_token: Option<u64>,
    ttl: Ttl,
    when_left: f64,
    state: Mutex<LeaseState>,
    /// Wakes the guard when an extension ends or the lock is lost.
    wake: Condvar,
}

#[derive(Default)]
struct LeaseState {
    /// The validity deadline; `None` once the lock is lost.
    deadline: Option<Instant>,
    /// The watchdog will not extend any more.
    ending: bool,
    /// The last round's report, for the lost-lock error.
    report: Report,
    /// The guard is done: no extension starts any more.
    done: bool,
    extending: bool,
    failures: Failures,
    panic: Option<String>,
    /// Why an extension found the lock lost (else its validity ran out).
    loss: Option<Loss>,
    /// The loss callbacks, until the loss is told.
    on_lost: Vec<OnLost>,
    told: bool,
    /// The callbacks queued for the notifier that have not returned yet.
    pending: usize,
}

impl LeaseState {
    /// The deadline while the lock is held; once it has passed, the lock is
    /// lost for good.
    fn deadline(&mut self) -> Option<Instant> {
        self.deadline = self.deadline.filter(|&d| Instant::now() < d);
        self.deadline
    }
}

impl Lease {
    /// The lease of `lock`, kept as `call` says and extended by `ttl`.
    fn new(lock: &Lock, call: &Call, ttl: Ttl) -> Arc<Lease> {
        let hold_deadline = (call.max_hold).and_then(|cap| Instant::now().checked_add(cap));
        Arc::new(Lease {
            hold_deadline,
            kind: lock.kind,
            resources: lock.resources.clone(),
            token: lock.token,
            fencing_token: lock.fencing_token,
            ttl,
            when_left: call.extend_when_left,
            state: Mutex::new(LeaseState {
                deadline: lock.valid_until,
                // A cap that the first validity reaches leaves no extension.
                ending: hold_deadline.is_some_and(|hold| hold <= lock.valid_until()),
                report: lock.report.clone(),
                ..LeaseState::default()
            }),
            wake: Condvar::new(),
        })
    }

    /// The lost-lock error: the panic that ended the lease, or the loss.
    fn lost(&self) -> LockError {
        let state = lock(&self.state);
        match &state.panic {
            Some(message) => self.panicked(message.clone()),
            None => LockError::Lost {
                resource: self.resources[0].clone(),
                report: state.report.clone(),
                reason: state.loss.unwrap_or(Loss::Expired),
            },
        }
    }

    pub(crate) fn panicked(&self, message: String) -> LockError {
        let resource = self.resources[0].clone();
        LockError::Panicked { resource, message }
    }

    /// The watchdog's claim before a round: the TTL to extend by, cut to end
    /// at the hold cap. Else when the lease is due next, or `None` once the
    /// watchdog is done with it. A lease no longer extended is due at its
    /// deadline, to tell the loss.
    pub(crate) fn claim(self: &Arc<Self>, client: &Redlock) -> Result<Ttl, Option<Instant>> {
        let mut state = lock(&self.state);
        // Lost: due no more once the loss is told. Done: at once, untold.
        let Some(deadline) = state.deadline().filter(|_| !state.done) else {
            drop(state);
            return Err(self.tell(client));
        };
        let now = Instant::now();
        let full = self.ttl.duration();
        let room = (self.hold_deadline).map_or(full, |h| h.saturating_duration_since(now));
        // A TTL cut to end at the cap may be too short: no extension is left.
        let ttl = client.check_ttl(room.min(full)).ok();
        let ttl = ttl.filter(|_| !state.ending && room > deadline.saturating_duration_since(now));
        (state.extending, state.ending) = (ttl.is_some(), ttl.is_none());
        ttl.ok_or(Some(deadline))
    }

    /// The watchdog's turn after the extension by `ttl` ended in `result`,
    /// with `kept`, the lock as measured. Returns when the lease is due
    /// next, as [`claim`](Self::claim) does.
    pub(crate) fn extended(
        self: &Arc<Self>,
        client: &Redlock,
        kept: &Lock,
        ttl: Ttl,
        result: Result<(), LockError>,
    ) -> Option<Instant> {
        let mut state = lock(&self.state);
        state.extending = false;
        self.wake.notify_all();
        // What to tell, if anything, and the count of failed rounds.
        let mut told = (None, 0);
        let due = match &result {
            Ok(()) => {
                told = (Some(What::Extended), state.failures.end());
                // A TTL shortened to end at the cap was the last.
                state.ending = ttl < self.ttl;
                state.report = kept.report.clone();
                // The cut TTL was measured before the round began: the
                // validity must not run past the cap.
                let valid_until = (self.hold_deadline)
                    .map_or(kept.valid_until(), |hold| hold.min(kept.valid_until()));
                state.deadline = state.deadline().map(|_| valid_until);
                self.due(&mut state)
            }
            Err(LockError::Lost { report, reason, .. }) => {
                (state.report, state.loss, state.deadline) = (report.clone(), Some(*reason), None);
                None
            }
            Err(LockError::Panicked { message, .. }) => {
                (state.panic, state.deadline) = (Some(message.clone()), None);
                None
            }
            Err(e) => {
                let new = state.failures.failed(e);
                told = (new.then_some(What::ExtendFailed), state.failures.count);
                state.report = e.report().unwrap_or(&state.report).clone();
                self.retry(client, &mut state)
            }
        };
        drop(state);
        // Every round is seen, to keep the nodes' state; not every one told.
        let (ids, outcome) = ((&self.resources[..], &self.token), result.as_ref());
        let outcome = outcome.map(|()| &kept.report);
        client.observe_counted(told.0, ids, (0, told.1), outcome);
        due.or_else(|| self.tell(client))
    }

    /// When a failed extension is tried again (`RetryPolicy::next_extension`).
    /// `None` once the validity ran out, or if the backoff panicked. A panic
    /// ends the lease, as its error.
    fn retry(&self, client: &Redlock, state: &mut LeaseState) -> Option<Instant> {
        let (deadline, failures) = (state.deadline()?, state.failures.count);
        let policy = &client.config().retry;
        match caught(|| policy.next_extension(failures, Retries::WhileValid, Some(deadline))) {
            Ok(due) => due,
            Err(panic) => {
                let message = format!("the retry policy's backoff panicked: {panic}");
                (state.panic, state.deadline) = (Some(message), None);
                None
            }
        }
    }

    /// When the lease is due next while held. No longer extended, at its
    /// deadline. Else once only the share `when_left` of the validity is
    /// left. The share is of the validity each round leaves, so the next
    /// extension is always some time away.
    fn due(&self, state: &mut LeaseState) -> Option<Instant> {
        let (deadline, now) = (state.deadline()?, Instant::now());
        let left = if state.ending { 0.0 } else { self.when_left };
        let wait = deadline.saturating_duration_since(now).mul_f64(1.0 - left);
        Some(later(now, wait).min(deadline))
    }

    /// Tells the loss once, and never for a guard released while held.
    /// Wakes the waiters, releases the lock if a panic ended the lease,
    /// tells the observer and queues the callbacks. Returns `None`: the
    /// watchdog is done with the lease.
    fn tell(self: &Arc<Self>, client: &Redlock) -> Option<Instant> {
        let mut state = lock(&self.state);
        state.ending = true;
        if mem::replace(&mut state.told, true) {
            return None;
        }
        let callbacks = mem::take(&mut state.on_lost);
        let failures = state.failures.count;
        // Counted now: a wait for the callbacks covers those not queued yet.
        state.pending += callbacks.len();
        // A guard that is done releases on its own.
        let panicked = state.panic.is_some() && !state.done;
        drop(state);
        self.wake.notify_all();
        if panicked {
            let _ = client.release_token(self.kind, &self.resources, &self.token);
        }
        let lost = self.lost();
        let ids = (&self.resources[..], &self.token);
        client.observe_counted(Some(What::Lost), ids, (0, failures), Err(&lost));
        for callback in callbacks {
            self.notify(client, callback);
        }
        None
    }

    /// Queues `callback`, counted in `pending` already, for the notifier.
    /// Once it returns or panics, or if no notifier can start (then it
    /// never runs), `pending` counts it no more.
    fn notify(self: &Arc<Self>, client: &Redlock, callback: OnLost) {
        let lease = Arc::clone(self);
        let error = self.lost();
        let queued = client.watchdog().notify(Box::new(move || {
            let _ = caught(|| callback(&error));
            lock(&lease.state).pending -= 1;
            lease.wake.notify_all();
        }));
        // The job comes back unrun: dropping it drops the callback, and
        // running it would run the callback here.
        if queued.is_err() {
            lock(&self.state).pending -= 1;
            self.wake.notify_all();
        }
    }

    /// Waits until the loss is told and its callbacks have returned, or
    /// `end`, and returns whether they have. The lock must be lost already.
    /// The watchdog tells it, after the round that found it, if any. On the
    /// notifier and the watchdog, it is told here, and no callback waited
    /// for: they would wait for themselves.
    fn wait_told(self: &Arc<Self>, client: &Redlock, end: Option<Instant>) -> bool {
        if !client.watchdog().may_wait() {
            self.tell(client);
            return true;
        }
        let state = wait(&self.wake, lock(&self.state), end, |s| {
            !s.told || s.pending > 0
        });
        state.told && state.pending == 0
    }
}

/// Waits on `wake` while `busy` says so, until `end` if any.
fn wait<'a>(
    wake: &Condvar,
    state: MutexGuard<'a, LeaseState>,
    end: Option<Instant>,
    busy: impl Fn(&LeaseState) -> bool,
) -> MutexGuard<'a, LeaseState> {
    let Some(end) = end else {
        let waited = wake.wait_while(state, |s| busy(s));
        return waited.unwrap_or_else(PoisonError::into_inner);
    };
    let left = end.saturating_duration_since(Instant::now());
    let waited = wake.wait_timeout_while(state, left, |s| busy(s));
    waited.unwrap_or_else(PoisonError::into_inner).0
}

impl LockGuard {
    /// The resource held (the first one, for a lock over several).
    pub fn resource(&self) -> &str {
        &self.lease.resources[0]
    }

    /// Every resource held, in the order given.
    pub fn resources(&self) -> &[String] {
        &self.lease.resources
    }

    /// The token that proves ownership. Extensions keep it.
    pub fn token(&self) -> &Token {
        &self.lease.token
    }

    /// The fencing token of a [`Kind::Fenced`] lock, else `None`. Extensions
    /// keep it. See [`Lock::fencing_token`].
    pub fn fencing_token(&self) -> Option<u64> {
        self.lease.fencing_token
    }

    /// The kind of lock held.
    pub fn kind(&self) -> Kind {
        self.lease.kind
    }

    /// How long the lock is still valid, as of the last extension, by the
    /// monotonic clock. Zero once it is lost.
    pub fn validity(&self) -> Duration {
        let (deadline, now) = (lock(&self.lease.state).deadline(), Instant::now());
        deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(now))
    }

    /// Whether the lock is still held. False for good once an extension was
    /// refused or the validity ran out.
    pub fn is_held(&self) -> bool {
        lock(&self.lease.state).deadline().is_some()
    }

    /// `Ok(())` while the lock is held, else the lost-lock error: the
    /// `?`-friendly [`is_held`](Self::is_held).
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] once the lock is lost, with the watchdog's last
    /// report. [`LockError::Panicked`] instead if the backoff panicked on
    /// the watchdog (the guard released the lock).
    pub fn check(&self) -> Result<(), LockError> {
        let held = self.is_held();
        held.then_some(()).ok_or_else(|| self.lease.lost())
    }

    /// Blocks until the lock is lost and its [`on_lost`](Self::on_lost)
    /// callbacks have returned, or `timeout` passed. Returns true in the
    /// first case. It wakes within one extension retry of the loss, plus
    /// the callbacks' time. Another thread may wait while the owner works:
    /// the guard is `Sync`.
    ///
    /// Within a callback it waits for no callback: that would wait for
    /// itself.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// locks.with_lock("leader", Duration::from_secs(10), |guard| {
    ///     while !guard.wait_lost(Duration::from_secs(1)) {
    ///         println!("still the leader");
    /// #       break;
    ///     }
    ///     guard.check() // Err(Lost) once lost
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        let end = later(Instant::now(), timeout);
        let mut state = lock(&self.lease.state);
        while let Some(deadline) = state.deadline() {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            let left = deadline.min(end).saturating_duration_since(now);
            let waited = self.lease.wake.wait_timeout(state, left);
            state = waited.unwrap_or_else(PoisonError::into_inner).0;
        }
        drop(state);
        self.lease.wait_told(&self.client, Some(end))
    }

    /// Runs `callback` with the lost-lock error once the lock is lost. If it
    /// is lost already, at once. It runs on the client's notifier thread,
    /// within one extension retry of the loss.
    ///
    /// A loss before the release is never skipped. Once the lock is lost,
    /// [`wait_lost`](Self::wait_lost) returns true only after the callbacks
    /// have returned. A drop or [`unlock`](Self::unlock) waits for them too:
    /// a callback must not wait for what the releasing thread holds. A
    /// guard released while held runs none, ever.
    ///
    /// Callbacks run one at a time: one that blocks delays the others, and
    /// the releases that wait for them, never an extension. A panic in one is caught. A
    /// callback may drop or unlock guards, its own included: on the
    /// notifier, a release waits for no callback.
    pub fn on_lost(&self, callback: impl FnOnce(&LockError) + Send + 'static) {
        let mut state = lock(&self.lease.state);
        if !state.told {
            state.on_lost.push(Box::new(callback));
        } else if !state.done {
            state.pending += 1;
            drop(state);
            self.lease.notify(&self.client, Box::new(callback));
        }
    }

    /// Whether the lock will not be extended any more: its validity reaches
    /// the hold cap ([`max_hold`](crate::RedlockBuilder::max_hold)), or it
    /// is lost. It may still be held for [`validity`](Self::validity): wind
    /// the work down.
    pub fn is_ending(&self) -> bool {
        !self.is_held() || lock(&self.lease.state).ending
    }

    /// When extensions stop (monotonic clock), if a hold cap is set: the
    /// acquisition plus [`max_hold`](crate::RedlockBuilder::max_hold).
    pub fn hold_deadline(&self) -> Option<Instant> {
        self.lease.hold_deadline
    }

    /// Releases the lock on every node and says how it went. Dropping the
    /// guard does the same, quietly.
    ///
    /// # Errors
    ///
    /// - [`LockError::Lost`] if the lock was lost at any moment while held,
    ///   or the release found it gone. The work may have overlapped another
    ///   holder's. The release ran anyway.
    /// - [`LockError::Panicked`] instead of `Lost` if the backoff panicked.
    /// - [`LockError::NoQuorum`] when too few nodes answered the release.
    pub fn unlock(self) -> Result<Report, LockError> {
        self.finish().unwrap_or_else(|| Err(self.lease.lost()))
    }

    /// Takes the lease from the watchdog, waiting for an extension in
    /// flight, and releases the lock. After a loss, waits for its
    /// callbacks. `None` after the first time.
    fn finish(&self) -> Option<Result<Report, LockError>> {
        let lease = &*self.lease;
        let mut state = lock(&lease.state);
        // Held now means held all along: a passed deadline never moves.
        let held = state.deadline().is_some();
        if mem::replace(&mut state.done, true) {
            return None;
        }
        if held {
            // Released while held, there is no loss to tell, ever.
            state.on_lost = Vec::new();
            state.told = true;
        }
        drop(wait(&lease.wake, state, None, |state| state.extending));
        let released = (self.client).release_token(lease.kind, &lease.resources, &lease.token);
        if held {
            return Some(released);
        }
        // Lost before the release: the loss is told (now, if the watchdog
        // has not yet), and its callbacks run before the guard is gone.
        self.lease.tell(&self.client);
        self.lease.wait_told(&self.client, None);
        Some(Err(lease.lost()))
    }
}

/// Releases the lock unless [`unlock`](LockGuard::unlock) did. Never panics.
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
    /// Acquires as [`acquire`](Self::acquire) does, and returns a guard that
    /// keeps the lock alive. Use it for code that does not fit in the closure
    /// of [`with_lock`](Self::with_lock).
    ///
    /// Unless the options set a [`Patience`], it waits
    /// [`WhileHeld`](Patience::WhileHeld): for as long as another client
    /// holds the lock, within the builder's `max_wait` if set.
    ///
    /// The guard's watchdog extends the lock by the TTL
    /// ([`LockOptions::extend_when_left`]), up to the hold cap
    /// ([`LockOptions::max_hold`]).
    ///
    /// # Errors
    ///
    /// - As [`acquire`](Self::acquire), and [`LockError::Argument`] for an
    ///   `extend_when_left` outside `(0, 1)`.
    /// - [`LockError::Lost`] if the validity ran out before the guard was
    ///   made. The lock is released.
    /// - [`LockError::Thread`] if the OS cannot start the watchdog thread.
    ///   The lock is released.
    pub fn lock(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
    ) -> Result<LockGuard, LockError> {
        let mut options = options.into();
        // A guard's door waits while another holds the lock, by default.
        options.patience = options.patience.or(Some(Patience::WhileHeld));
        let (acquired, call) = self.acquire_with(resources.into_resources(), &options)?;
        let lease = Lease::new(&acquired, &call, Ttl::whole_ms(options.ttl));
        let guard = LockGuard {
            lease: Arc::clone(&lease),
            client: self.clone(),
        };
        let due = lease.due(&mut lock(&lease.state));
        // Out of validity already, or no watchdog: no guard (its drop releases).
        let due = due.ok_or_else(|| lease.lost())?;
        let watched = self.watchdog().add(self, (due, lease, acquired));
        watched.map(|()| guard).map_err(LockError::Thread)
    }

    /// Like [`lock`](Self::lock), but one attempt only: no retry.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    pub fn try_lock(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
    ) -> Result<LockGuard, LockError> {
        self.lock(resources, options.into().patience(Patience::Retries(0)))
    }

    /// Acquires as [`lock`](Self::lock) does, runs `f` under the guard, and
    /// releases the lock when `f` returns or panics.
    ///
    /// `f` may run past the TTL, up to the hold cap. Call
    /// [`check`](LockGuard::check) before each step. The error type needs
    /// only `From<LockError>`, so `?` works on both kinds of error.
    ///
    /// That type is generic, and Rust does not infer it from `?` alone. A
    /// function that returns the call's result names it, and so does a
    /// `match` on its error. Else end `f` with `Ok::<_, LockError>(value)`.
    /// A default type would need a second door, or one `E` for everyone.
    ///
    /// A loop passes its options by reference (`&options`): see
    /// [`LockOptions`].
    ///
    /// Record results inside `f`, after a last `check`. Once `with_lock`
    /// returns, another worker may hold the lock (see
    /// `examples/batch_jobs.rs`).
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
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"]).map_err(JobError::Lock)?;
    /// let total = locks.with_lock("nightly-report", Duration::from_secs(10), |guard| {
    ///     let mut total = 0;
    ///     for chunk in 0..1_000 {
    ///         guard.check()?; // a LockError, converted into a JobError
    ///         if chunk > 10_000 { return Err(JobError::Invalid(format!("chunk {chunk}"))); }
    ///         total += chunk;
    ///     }
    ///     Ok(total)
    /// })?;
    /// println!("total {total}");
    /// # Ok::<(), JobError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - What [`lock`](Self::lock) returns. `f` does not run then.
    /// - `f`'s own error. It comes first, even if the lock was also lost: it
    ///   says why the work stopped.
    /// - [`LockError::Lost`] if `f` returned `Ok`, but the lock was lost
    ///   while it ran or the release found it gone. `f`'s value is dropped:
    ///   the work may have overlapped another holder's. [`LockError::Panicked`]
    ///   replaces `Lost` as for [`check`](LockGuard::check).
    ///
    /// A release that reaches too few nodes is not an error. The keys left
    /// behind expire within the TTL.
    ///
    /// # Panics
    ///
    /// If `f` panics, after releasing the lock. With `panic = "abort"`, the
    /// keys expire within the TTL instead.
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
        let guard = self.lock(resources, options)?;
        // A panic in `f`, or its error, goes through the guard's drop, which
        // releases.
        let value = f(&guard)?;
        match guard.unlock() {
            Err(lost @ (LockError::Lost { .. } | LockError::Panicked { .. })) => Err(lost.into()),
            _ => Ok(value),
        }
    }

    /// Like [`with_lock`](Self::with_lock), but one attempt only: it returns
    /// at once when another client holds the lock.
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock).
    ///
    /// # Panics
    ///
    /// If `f` panics, after releasing the lock.
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
        self.with_lock(resources, options.into().patience(Patience::Retries(0)), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::Token;

    /// A lease of a lock valid for `valid`, extended at a third left, with
    /// a hold cap of `max_hold` if any; and a client over nodes nobody
    /// listens on (no round is run).
    fn lease(valid: Duration, max_hold: Option<Duration>) -> (Arc<Lease>, Redlock) {
        let client = Redlock::new(["redis://127.0.0.1:1"]).unwrap();
        let mut lock = Lock::from_token("r", Token::random().unwrap(), Kind::Plain).unwrap();
        lock.valid_until = Some(Instant::now() + valid);
        let call = Call {
            max_hold,
            extend_when_left: 1.0 / 3.0,
            ..Call::default()
        };
        (Lease::new(&lock, &call, Ttl::whole_ms(valid)), client)
    }

    #[test]
    fn a_lease_is_lost_for_good_once_its_deadline_passed() {
        let (lease, _) = lease(Duration::from_millis(20), None);
        assert!(lock(&lease.state).deadline().is_some());
        std::thread::sleep(Duration::from_millis(30));
        assert!(lock(&lease.state).deadline().is_none());
        // Nothing brings a passed deadline back.
        assert_eq!(lock(&lease.state).deadline(), None);
    }

    #[test]
    fn a_lease_is_due_when_a_third_of_its_validity_is_left_and_claims_its_ttl() {
        let valid = Duration::from_secs(30);
        let (lease, client) = lease(valid, None);
        let due = lease.due(&mut lock(&lease.state)).unwrap();
        let after = due.saturating_duration_since(Instant::now());
        assert!(
            after > Duration::from_secs(19) && after <= Duration::from_secs(20),
            "{after:?}"
        );
        assert_eq!(lease.claim(&client).ok(), Some(Ttl::whole_ms(valid)));
        assert!(
            lock(&lease.state).extending,
            "a claim marks the extension in flight"
        );
    }

    #[test]
    fn a_lease_whose_hold_cap_the_validity_reaches_claims_no_extension_and_is_due_at_its_deadline()
    {
        let (lease, client) = lease(Duration::from_secs(30), Some(Duration::from_secs(10)));
        let deadline = lock(&lease.state).deadline().unwrap();
        assert_eq!(lease.claim(&client), Err(Some(deadline)));
        assert!(lock(&lease.state).ending);
    }

    #[test]
    fn a_lease_that_is_done_claims_nothing_and_is_due_no_more() {
        let (lease, client) = lease(Duration::from_secs(30), None);
        lock(&lease.state).done = true;
        assert_eq!(lease.claim(&client), Err(None));
    }
}
