//! How one call locks: [`LockOptions`], [`Patience`] and [`Cancel`].

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::kind::Kind;
use crate::setters::setters;
use crate::sync::lock;

/// How long a waiting call goes on trying.
///
/// Unset, [`acquire`](crate::Redlock::acquire) and
/// [`extend`](crate::Redlock::extend) follow the client's
/// [`retry_policy`](crate::RedlockBuilder::retry_policy) within its
/// [`max_wait`](crate::RedlockBuilder::max_wait), and
/// [`lock`](crate::Redlock::lock) and [`with_lock`](crate::Redlock::with_lock)
/// wait [`WhileHeld`](Self::WhileHeld). Such a call can wait indefinitely
/// behind a holder that keeps extending: set `max_wait`, or pass
/// [`For`](Self::For), to bound it.
/// Whatever the patience, a [`Cancel`] ends the wait, and so does
/// [`LockError::Unusable`](crate::LockError::Unusable).
///
/// # Waiting for a release
///
/// A holder's release `PUBLISH`es on the resource's channel. A client's
/// waiting threads share one subscription, to one node. A message ends one
/// waiter's pause at once. A release through the same client wakes its
/// waiter without the network. These are hints: a woken waiter makes an
/// ordinary attempt, and a missed hint costs at most the pause. There is
/// no fairness: whoever's round lands first wins.
///
/// - Attempts made at news come on top of the retries. One that loses
///   right after news is tried again soon: a release reaches the nodes at
///   slightly different times.
/// - A clean-up after a failed attempt publishes nothing.
/// - Over TLS, or for an ACL user without channel permissions, waiters hear
///   of no other client's release. They sleep out their pauses.
/// - Channels are per server, not per database. A client on another
///   database may wake a waiter for nothing.
/// - With [`For`](Self::For) or [`Until`](Self::Until), a call gives up
///   within the deadline plus one round and its clean-up. A pause is cut to
///   the deadline, so a release heard before it still brings an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Patience {
    /// Up to this many retries, after the policy's pauses (no `max_wait`).
    Retries(u32),
    /// Retries, after the policy's pauses, for this long from the call's
    /// start.
    For(Duration),
    /// Retries, after the policy's pauses, until this instant.
    Until(Instant),
    /// Retries until the lock is won (or the call is cancelled).
    Forever,
    /// Retries for as long as another client holds the lock. The retry
    /// policy counts only the attempts that fail otherwise (too few nodes
    /// answered, too slow), in a row: after its retries of them, the call
    /// ends with that error. The builder's
    /// [`max_wait`](crate::RedlockBuilder::max_wait), when set, still bounds
    /// the whole wait. The default of `lock` and `with_lock`.
    WhileHeld,
}

/// How a call locks: the TTL, and what is not the client's default.
///
/// A [`Duration`] converts into options with only the TTL set. A
/// `&LockOptions` converts into a copy: a loop passes `&options` to each
/// call, with no `clone()`.
///
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{Kind, LockOptions, Patience, Redlock};
///
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// let leader = LockOptions::new(Duration::from_secs(10))
///     .kind(Kind::Fenced)
///     .patience(Patience::Forever)
///     .max_hold(Duration::from_secs(3600));
/// let guard = locks.lock("leader", &leader)?;
/// # drop(guard);
/// // The same options again, by reference.
/// let again = locks.lock("follower", &leader)?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) kind: Kind,
    pub(crate) patience: Option<Patience>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) extend_when_left: Option<f64>,
    pub(crate) cancel: Option<Cancel>,
    pub(crate) owner: Option<String>,
}

impl From<Duration> for LockOptions {
    fn from(ttl: Duration) -> LockOptions {
        LockOptions::new(ttl)
    }
}

/// A copy, for the doors that take `impl Into<LockOptions>`.
impl From<&LockOptions> for LockOptions {
    fn from(options: &LockOptions) -> LockOptions {
        options.clone()
    }
}

impl LockOptions {
    /// Options with this TTL, and the client's defaults. The TTL is how long
    /// the keys live on the nodes, and what each extension sets anew.
    pub fn new(ttl: Duration) -> LockOptions {
        LockOptions {
            ttl,
            ..LockOptions::default()
        }
    }

    setters! {
        /// Sets the kind of lock (an acquisition; `extend` goes by the lock's
        /// own kind). Defaults to [`Kind::Plain`].
        kind(kind: Kind) => kind = kind;

        /// Labels who holds the lock (say `host:pid`): a `&str` or a
        /// `String`, such as `format!("{host}:{pid}")`. It is stored with the
        /// lock on each node, and [`inspect`](crate::Redlock::inspect) shows
        /// it. 1 to 200 bytes, no control characters, else
        /// [`ArgumentError::Owner`](crate::ArgumentError::Owner). Defaults to
        /// no label.
        owner(label: impl Into<String>) => owner = Some(label.into());

        /// Sets how long the waiting forms go on trying (`extend`'s retries
        /// included). The `try_` forms make one attempt whatever it says.
        /// Defaults to the client's retry policy and
        /// [`max_wait`](crate::RedlockBuilder::max_wait).
        patience(patience: Patience) => patience = Some(patience);

        /// Sets the hold cap of a guard (`lock`, `with_lock`). Its watchdog
        /// never extends the lock past this long after the acquisition.
        /// Defaults to the client's [`max_hold`](crate::RedlockBuilder::max_hold).
        max_hold(max_hold: Duration) => max_hold = Some(max_hold);

        /// Sets when a guard's watchdog extends: once only this share of the
        /// validity is left, in `(0, 1)`. Defaults to the client's
        /// [`extend_when_left`](crate::RedlockBuilder::extend_when_left).
        extend_when_left(fraction: f64) => extend_when_left = Some(fraction);

        /// Lets `cancel` end the wait (see [`Cancel`]). Defaults to none.
        cancel(cancel: &Cancel) => cancel = Some(cancel.clone());
    }
}

/// Ends a wait from another thread. Its clones cancel the same calls.
///
/// Pass it with [`LockOptions::cancel`], and call [`cancel`](Self::cancel)
/// from anywhere. A cancelled call starts no more rounds. A round under way
/// runs to its end, and a lock it won is released. The call then returns
/// [`LockError::Cancelled`](crate::LockError::Cancelled). A cancelled
/// `extend` leaves the lock as it was. A guard's watchdog and a running
/// `with_lock` closure are never touched. A cancelled handle stays
/// cancelled: later calls with it return `Cancelled` at once.
#[derive(Clone, Default)]
pub struct Cancel(Arc<Cancelled>);

/// The shared state of a [`Cancel`] and its clones.
#[derive(Default)]
struct Cancelled {
    /// Set once, for good (under `wakers`' lock).
    done: AtomicBool,
    /// Called on cancellation: each wakes a waiter that sleeps elsewhere.
    wakers: Mutex<Vec<Waker>>,
    /// Sleepers of [`Cancel::sleep_until`] wait on it.
    rang: Condvar,
}

type Waker = Arc<dyn Fn() + Send + Sync>;

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl Cancel {
    /// A handle not cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels every call given this handle or a clone.
    pub fn cancel(&self) {
        let mut guard = lock(&self.0.wakers);
        self.0.done.store(true, Ordering::Release);
        let wakers = std::mem::take(&mut *guard);
        drop(guard);
        wakers.into_iter().for_each(|wake| wake());
        self.0.rang.notify_all();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.done.load(Ordering::Acquire)
    }

    /// Calls `wake` on cancellation (at once if cancelled already), until
    /// the returned registration is dropped.
    pub(crate) fn on_cancel(&self, wake: Waker) -> Registered<'_> {
        let mut wakers = lock(&self.0.wakers);
        if self.is_cancelled() {
            drop(wakers);
            wake();
        } else {
            wakers.push(Arc::clone(&wake));
        }
        Registered { cancel: self, wake }
    }

    /// Sleeps until `until` or the cancellation, whichever comes first.
    pub(crate) fn sleep_until(&self, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        let wakers = lock(&self.0.wakers);
        let _ = (self.0.rang).wait_timeout_while(wakers, left, |_| !self.is_cancelled());
    }
}

/// A waker registered with [`Cancel::on_cancel`], removed when dropped.
pub(crate) struct Registered<'a> {
    cancel: &'a Cancel,
    wake: Waker,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        lock(&self.cancel.0.wakers).retain(|other| !Arc::ptr_eq(other, &self.wake));
    }
}
