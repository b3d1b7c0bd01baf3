//! Locks kept alive by the client's watchdog: [`LockGuard`], which
//! [`Redlock::lock`] returns and which releases the lock when dropped, and
//! [`Redlock::with_lock`], which runs a closure under such a guard.
//!
//! Each guard shares its [`Lease`] with the client's watchdog (see
//! `watch.rs`), which extends it when due. The guard's view of the lock is
//! its validity deadline, under a mutex the watchdog takes only to claim an
//! extension and to publish its outcome: it only moves forward while the
//! lock is held, and once lost (whoever first sees it passed, the guard or
//! the watchdog, marks it) it stays so; an extension that ended after the
//! deadline passed does not revive it. The guard marks itself done under
//! the same mutex and waits for an extension in flight, and the watchdog
//! claims no extension of a lease that is done: no extension is written
//! after the release round starts. A guard that is never dropped
//! (`mem::forget`) stays extended up to the hold cap, or as long as the
//! client lives.
//!
//! User code the watchdog runs for a lease (the retry policy's backoff)
//! runs under `catch_unwind`: a panic ends that lease alone, as a loss
//! whose error names it ([`LockError::Panicked`]), and releases its lock.
//! A loss callback is queued with its lease and runs only if the guard is
//! not done when its turn comes.

use std::fmt;
use std::mem;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::config::Call;
use super::observe::{caught, Failures};
use super::{Redlock, Tries};
use crate::error::{LockError, Loss, Report};
use crate::event::What;
use crate::kind::Kind;
use crate::lock::{IntoResources, Lock};
use crate::request::LockOptions;
use crate::retry::Retries;
use crate::time::{later, Ttl};
use crate::token::Token;

/// A loss callback ([`LockGuard::on_lost`]).
type OnLost = Box<dyn FnOnce(&LockError) + Send>;

/// A lock held until the guard is dropped or [unlocked](Self::unlock),
/// and kept alive meanwhile by the client's watchdog: what [`Redlock::lock`]
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
/// Either waits for an extension of this guard in flight, which takes at
/// most one round (`connect_timeout` + `io_timeout`).
///
/// The client's one watchdog thread keeps all its guards (see
/// [`RedlockBuilder::observer`](crate::RedlockBuilder::observer) for its
/// events): with any number of guards, at most two threads besides the
/// callers', the watchdog and the notifier that runs
/// [`on_lost`](Self::on_lost) callbacks. The guards whose extensions fall
/// due together share a round (one script call a node extends them all,
/// each counted on its own), so each extension starts at most one round
/// after its point, however many guards are due and however slow a node
/// is. A failed extension (too few nodes answered) is retried while
/// validity is left, after the retry policy's pause (the last retry's once
/// the retries are used up; none with no retries) or half the validity
/// left, whichever is shorter. If the policy's
/// [`backoff`](crate::RetryPolicy::backoff) panics there, this guard stops
/// holding the lock and releases it, as if lost, with
/// [`LockError::Panicked`]; the other guards go on. A guard that is never
/// dropped (`mem::forget`) stays extended up to the hold cap, or as long as
/// the client lives.
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

/// The lease as the guard and the watchdog share it: what it holds, and
/// its state under one lock.
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

/// The lease's state.
#[derive(Default)]
struct LeaseState {
    /// The validity deadline; `None` once the lock is lost, for good. It
    /// only moves forward, and only while it has not passed.
    deadline: Option<Instant>,
    /// The watchdog will not extend any more.
    ending: bool,
    /// What the nodes answered in the watchdog's last round (at first, in
    /// the acquisition's): the report of the lost-lock error.
    report: Report,
    /// The guard is done: no extension starts any more.
    done: bool,
    /// An extension is in flight.
    extending: bool,
    /// Extensions failed in a row.
    failures: Failures,
    /// What panicked and ended the lease, if anything did.
    panic: Option<String>,
    /// Why an extension found the lock lost (else its validity ran out).
    loss: Option<Loss>,
    /// The loss callbacks, until the loss is told.
    on_lost: Vec<OnLost>,
    told: bool,
}

impl LeaseState {
    /// The validity deadline while the lock is held; marks the lock lost
    /// for good once its deadline has passed.
    fn deadline(&mut self) -> Option<Instant> {
        self.deadline = self.deadline.filter(|&d| Instant::now() < d);
        self.deadline
    }
}

impl Lease {
    /// The lease of `lock`, which a guard keeps as `call` says, extending it
    /// by `ttl`.
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
                // A cap the acquisition's validity already reaches leaves
                // no extension to come.
                ending: hold_deadline.is_some_and(|hold| hold <= lock.valid_until()),
                report: lock.report.clone(),
                ..LeaseState::default()
            }),
            wake: Condvar::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(
        &self,
        state: MutexGuard<'a, LeaseState>,
        timeout: Duration,
    ) -> MutexGuard<'a, LeaseState> {
        let waited = self.wake.wait_timeout(state, timeout);
        waited.unwrap_or_else(PoisonError::into_inner).0
    }

    fn held(&self) -> bool {
        self.state().deadline().is_some()
    }

    /// The lost-lock error: the panic that ended the lease, or the loss
    /// with the report of the last round.
    fn lost(&self) -> LockError {
        let state = self.state();
        match &state.panic {
            Some(message) => self.panicked(message.clone()),
            None => LockError::Lost {
                resource: self.resources[0].clone(),
                report: state.report.clone(),
                reason: state.loss.unwrap_or(Loss::Expired),
            },
        }
    }

    /// The error of a lease that `message` (what panicked, and how) ended.
    pub(crate) fn panicked(&self, message: String) -> LockError {
        let resource = self.resources[0].clone();
        LockError::Panicked { resource, message }
    }

    /// The watchdog's claim on this lease, before a round: `Ok` with the
    /// TTL to extend it by (shortened to end at the hold cap), or else when
    /// it is due next (`None` when the watchdog is done with it: the guard
    /// is done, or the loss was told). A lease that is not extended any
    /// more is due at its deadline, to tell the loss then.
    pub(crate) fn claim(self: &Arc<Self>, client: &Redlock) -> Result<Ttl, Option<Instant>> {
        let mut state = self.state();
        // Lost, the lease is due no more once the loss is told; done, at
        // once (its loss is not told).
        let Some(deadline) = state.deadline().filter(|_| !state.done) else {
            drop(state);
            return Err(self.tell(client));
        };
        let now = Instant::now();
        let full = self.ttl.duration();
        let room = (self.hold_deadline).map_or(full, |h| h.saturating_duration_since(now));
        // A TTL shortened to end at the cap may be too short to extend
        // anything: then the last extension is past.
        let checked = client.check_ttl(room.min(full));
        let ttl = match checked {
            Ok(ttl) if !state.ending && room > deadline.saturating_duration_since(now) => ttl,
            _ => {
                state.ending = true;
                return Err(Some(deadline));
            }
        };
        state.extending = true;
        Ok(ttl)
    }

    /// The watchdog's turn on this lease after its extension by `ttl`
    /// ended in `result` with `lock` as it measured it: returns when the
    /// lease is due next, as [`claim`](Self::claim) does. A refused
    /// extension loses the lock; a failed one (too few nodes answered) is
    /// due again after a pause (see [`retry`](Self::retry)), while validity
    /// is left. The observer hears of the first failure of a run and of its
    /// end (see `watch.rs`).
    pub(crate) fn extended(
        self: &Arc<Self>,
        client: &Redlock,
        lock: &Lock,
        ttl: Ttl,
        result: Result<(), LockError>,
    ) -> Option<Instant> {
        let mut state = self.state();
        state.extending = false;
        self.wake.notify_all();
        // What to tell, if anything, and the failed rounds so far.
        let mut told = (None, 0);
        let due = match &result {
            Ok(()) => {
                told = (Some(What::Extended), state.failures.end());
                // A TTL shortened to end at the cap was the last.
                state.ending = ttl < self.ttl;
                state.report = lock.report.clone();
                // The shortened TTL was measured before the round began:
                // never let the validity run past the cap.
                let valid_until = (self.hold_deadline)
                    .map_or(lock.valid_until(), |hold| hold.min(lock.valid_until()));
                state.deadline = state.deadline().map(|_| valid_until);
                self.due(&mut state)
            }
            Err(LockError::Lost { report, reason, .. }) => {
                (state.report, state.deadline) = (report.clone(), None);
                state.loss = Some(*reason);
                None
            }
            Err(LockError::Panicked { message, .. }) => {
                (state.panic, state.deadline) = (Some(message.clone()), None);
                None
            }
            Err(e) => {
                let new = state.failures.failed(e);
                told = (new.then_some(What::ExtendFailed), state.failures.count());
                state.report = e.report().unwrap_or(&state.report).clone();
                self.retry(client, &mut state)
            }
        };
        drop(state);
        // Every round is seen, to keep the nodes' state; not every one told.
        let (ids, outcome) = ((&self.resources[..], &self.token), result.as_ref());
        let outcome = outcome.map(|()| &lock.report);
        client.observe_counted(told.0, ids, (0, told.1), outcome);
        due.or_else(|| self.tell(client))
    }

    /// When a failed extension is tried again: after the retry policy's
    /// pause (never asked past its retry count), at most half the validity
    /// left (more tries before it runs out, whatever the policy; with no
    /// retries, half the validity left), and never at once. `None` once the
    /// validity ran out, or if the backoff panicked: the lease then ends,
    /// with the panic as its error.
    fn retry(&self, client: &Redlock, state: &mut LeaseState) -> Option<Instant> {
        let (deadline, failures) = (state.deadline()?, state.failures.count());
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

    /// When the lease is due next while the lock is held: at its deadline
    /// once it is not extended any more, else when the next extension is,
    /// once only the share `when_left` of the validity is left. Measured on
    /// the validity each round leaves, not on the TTL: the next extension
    /// is always some time away, whatever the fraction and the drift term.
    fn due(&self, state: &mut LeaseState) -> Option<Instant> {
        let (deadline, now) = (state.deadline()?, Instant::now());
        let share = if state.ending {
            1.0
        } else {
            1.0 - self.when_left
        };
        let wait = deadline.saturating_duration_since(now).mul_f64(share);
        Some(later(now, wait).min(deadline))
    }

    /// Tells the loss once (never for a guard released while it held the
    /// lock): wakes the threads waiting for it, releases the lock if a
    /// panic ended the lease, tells the observer, and queues the callbacks
    /// for the notifier thread. Returns `None`: the watchdog is done with
    /// the lease.
    fn tell(self: &Arc<Self>, client: &Redlock) -> Option<Instant> {
        let mut state = self.state();
        state.ending = true;
        if mem::replace(&mut state.told, true) {
            return None;
        }
        let (callbacks, failures) = (mem::take(&mut state.on_lost), state.failures.count());
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

    /// Queues `callback` for the notifier, to run with the lost-lock error
    /// unless the guard is done by then.
    fn notify(self: &Arc<Self>, client: &Redlock, callback: OnLost) {
        let (lease, error) = (Arc::clone(self), self.lost());
        client.watchdog().notify(Box::new(move || {
            if !lease.state().done {
                callback(&error);
            }
        }));
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
        let (deadline, now) = (self.lease.state().deadline(), Instant::now());
        deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(now))
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
    /// was one); [`LockError::Panicked`] in its place if the retry policy's
    /// backoff panicked on the watchdog (the guard released the lock).
    pub fn check(&self) -> Result<(), LockError> {
        let held = self.lease.held();
        held.then_some(()).ok_or_else(|| self.lease.lost())
    }

    /// Blocks until the lock is lost or `timeout` has passed; returns
    /// whether it is lost. It returns as soon as the watchdog learns of
    /// the loss (an extension refused by a quorum) or the validity runs
    /// out (extensions kept failing, or the hold cap stopped them): within
    /// one extension retry of the moment the loss is known. Another thread
    /// can wait while the owner works (the guard is `Sync`).
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
        let mut state = self.lease.state();
        while let Some(deadline) = state.deadline() {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            state = (self.lease).wait(state, deadline.min(end).saturating_duration_since(now));
        }
        true
    }

    /// Registers `callback` to run once if the lock is lost while the
    /// guard holds it (at once if it is lost already), with the lost-lock
    /// error. It runs on the client's notifier thread, not the caller's,
    /// within one extension retry of the moment the loss is known (see
    /// [`wait_lost`](Self::wait_lost)). A callback never starts once the
    /// guard was dropped or [unlocked](Self::unlock), even one queued
    /// before (a release does not wait for one already running).
    ///
    /// Callbacks run one at a time: one that blocks delays the callbacks
    /// after it (never an extension of any guard); a panic in one is
    /// caught. A callback may drop or unlock guards, its own included.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::sync::atomic::{AtomicBool, Ordering};
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let stop = Arc::new(AtomicBool::new(false));
    /// locks.with_lock("reindex", Duration::from_secs(10), |guard| {
    ///     let stop_on_loss = Arc::clone(&stop);
    ///     guard.on_lost(move |e| {
    ///         eprintln!("{e}");
    ///         stop_on_loss.store(true, Ordering::SeqCst);
    ///     });
    ///     while !stop.load(Ordering::SeqCst) {
    ///         // one step of the work
    /// #       break;
    ///     }
    ///     guard.check()
    /// })?;
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn on_lost(&self, callback: impl FnOnce(&LockError) + Send + 'static) {
        let mut state = self.lease.state();
        if state.done {
            return;
        }
        if !state.told {
            return state.on_lost.push(Box::new(callback));
        }
        drop(state);
        self.lease.notify(&self.client, Box::new(callback));
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
    /// - [`LockError::Panicked`] in the place of `Lost` if the retry
    ///   policy's backoff panicked on the watchdog (see [`check`](Self::check)).
    /// - [`LockError::NoQuorum`] when too few nodes answered the release to
    ///   tell. The keys not deleted expire within the TTL.
    pub fn unlock(self) -> Result<Report, LockError> {
        self.finish().unwrap_or_else(|| Err(self.lease.lost()))
    }

    /// Takes the lease from the watchdog (waiting for an extension in
    /// flight), then releases the lock: the first time only (`None` after
    /// that: the lease is done).
    fn finish(&self) -> Option<Result<Report, LockError>> {
        let lease = &*self.lease;
        let mut state = lease.state();
        // Held now means held all along: the deadline never moves forward
        // once passed.
        let held = state.deadline().is_some();
        if mem::replace(&mut state.done, true) {
            return None;
        }
        // Released while held, there is no loss to tell, ever.
        (state.on_lost, state.told) = (Vec::new(), state.told || held);
        while state.extending {
            state = lease.wait(state, Duration::from_secs(1));
        }
        drop(state);
        // A loss the watchdog has not told yet (the validity ran out, and
        // the guard saw it first) is told now.
        if !held {
            self.lease.tell(&self.client);
        }
        let released = (self.client).release_token(lease.kind, &lease.resources, &lease.token);
        Some(if held { released } else { Err(lease.lost()) })
    }
}

/// Takes the lease from the watchdog and releases the lock, unless
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
    /// watchdog and releases it when dropped: the form of
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
        self.keep_alive(resources.into_resources(), &options.into(), Tries::Patient)
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
        self.keep_alive(resources.into_resources(), &options.into(), Tries::Once)
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
    /// Record results under the lock: write "job done" inside `f`, after a
    /// last [`check`](LockGuard::check). Written after `with_lock` returns,
    /// it comes after the release, and another worker may have taken the
    /// lock in between (`examples/batch_jobs.rs` shows the pattern).
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
    ///   gone (or [`LockError::Panicked`], as [`LockGuard::check`] says).
    ///   `f`'s value is dropped: the work may have overlapped another
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
        tries: Tries,
    ) -> Result<LockGuard, LockError> {
        let (lock, call) = self.acquire_with(resources, options, tries)?;
        let lease = Lease::new(&lock, &call, Ttl::whole_ms(options.ttl));
        let guard = LockGuard {
            lease: Arc::clone(&lease),
            client: self.clone(),
        };
        let due = lease.due(&mut lease.state());
        // Out of validity already, or no watchdog: no guard (its drop
        // releases).
        let due = due.ok_or_else(|| lease.lost())?;
        let watched = self.watchdog().add(self, (due, lease, lock));
        watched.map(|()| guard).map_err(LockError::Thread)
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
    // A panic in `f`, or its error, goes through the guard's drop, which
    // releases.
    let value = f(&guard)?;
    match guard.unlock() {
        Err(lost @ (LockError::Lost { .. } | LockError::Panicked { .. })) => Err(lost.into()),
        _ => Ok(value),
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
        assert!(lease.held());
        std::thread::sleep(Duration::from_millis(30));
        assert!(!lease.held());
        // Nothing brings a passed deadline back.
        assert_eq!(lease.state().deadline(), None);
    }

    #[test]
    fn a_lease_is_due_when_a_third_of_its_validity_is_left_and_claims_its_ttl() {
        let valid = Duration::from_secs(30);
        let (lease, client) = lease(valid, None);
        let due = lease.due(&mut lease.state()).unwrap();
        let after = due.saturating_duration_since(Instant::now());
        assert!(
            after > Duration::from_secs(19) && after <= Duration::from_secs(20),
            "{after:?}"
        );
        assert_eq!(lease.claim(&client).ok(), Some(Ttl::whole_ms(valid)));
        assert!(
            lease.state().extending,
            "a claim marks the extension in flight"
        );
    }

    #[test]
    fn a_lease_whose_hold_cap_the_validity_reaches_claims_no_extension_and_is_due_at_its_deadline()
    {
        let (lease, client) = lease(Duration::from_secs(30), Some(Duration::from_secs(10)));
        let deadline = lease.state().deadline().unwrap();
        assert_eq!(lease.claim(&client), Err(Some(deadline)));
        assert!(lease.state().ending);
    }

    #[test]
    fn a_lease_that_is_done_claims_nothing_and_is_due_no_more() {
        let (lease, client) = lease(Duration::from_secs(30), None);
        lease.state().done = true;
        assert_eq!(lease.claim(&client), Err(None));
    }
}
