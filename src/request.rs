//! How one call locks: its options ([`LockOptions`]: TTL, kind, patience,
//! hold cap, cancellation).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::kind::Kind;
use crate::setters::setters;

/// How long a waiting call goes on trying.
///
/// A call's [`LockOptions::patience`]; unset, the client's
/// [`retry_policy`](crate::RedlockBuilder::retry_policy) retries within its
/// [`max_wait`](crate::RedlockBuilder::max_wait). Whatever the patience,
/// a [`Cancel`] ends the wait, and so do errors that waiting cannot fix
/// ([`LockError::Unusable`](crate::LockError::Unusable)).
///
/// # Waiting for a release
///
/// A waiting call does not sleep out its pause blindly. A holder's release
/// `PUBLISH`es on the resource's channel on the nodes (in the release
/// script: no extra round trip); a client's waiting threads share one
/// subscription connection to one node, opened when a thread first waits
/// and closed by the client's next operation once no thread has waited
/// for a second; a message on a resource's channel ends one waiter's pause
/// at once, and a release through the same client wakes its own waiter
/// without the network. These are hints: a woken waiter makes an ordinary
/// attempt, so safety never depends on them, and a missed one costs at
/// most the pause. There is no fairness or FIFO order: whoever's round
/// lands first wins.
///
/// - Attempts made at news come on top of the retries counted, within
///   the same pause; one that loses right after news is tried once more
///   soon (a release reaches the nodes at slightly different times).
/// - A clean-up after a failed attempt publishes nothing, so waiters hear
///   only holders' releases.
/// - Over TLS, and for an ACL user without channel permissions (the
///   default for new users on Redis 7), waiters hear of no other client's
///   release and sleep their pauses (a release through the same client
///   still wakes them); for such a user the client tries the subscription
///   again less and less often (from every second up to every minute).
/// - Channels are per server, not per database: clients on other
///   databases of the same servers may wake a waiter for nothing (it costs
///   an attempt).
/// - With [`For`](Self::For) or [`Until`](Self::Until), a call gives up
///   within the deadline plus its last attempt's round and clean-up (each
///   at most `io_timeout`); a pause that would run past the deadline is
///   cut to it, so a release heard before the deadline still brings an
///   attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Patience {
    /// Up to this many retries, after the pauses of the client's retry
    /// policy (and no `max_wait`).
    Retries(u32),
    /// Retries, after the policy's pauses, for as long as this after the
    /// call began.
    For(Duration),
    /// Retries, after the policy's pauses, until this instant.
    Until(Instant),
    /// Retries until the lock is won (or the call is cancelled).
    Forever,
}

/// How a call locks: the TTL, and what is not the client's default.
///
/// A [`Duration`] converts into options with only the TTL set, so the
/// simple call stays `locks.acquire("invoice:42", ttl)`. Unset options take
/// the client's defaults (see [`RedlockBuilder`](crate::RedlockBuilder)).
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
/// let guard = locks.lock("leader", leader)?;
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
}

impl From<Duration> for LockOptions {
    fn from(ttl: Duration) -> LockOptions {
        LockOptions::new(ttl)
    }
}

impl LockOptions {
    /// Options with this TTL (how long the keys live on the nodes, and
    /// what each extension sets anew), and the client's defaults.
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

        /// Sets how long the waiting forms (`acquire`, `lock`, `with_lock`,
        /// and `extend`'s retries) go on trying; the `try_` forms make one
        /// attempt whatever it says. Defaults to the client's retry policy and
        /// [`max_wait`](crate::RedlockBuilder::max_wait).
        patience(patience: Patience) => patience = Some(patience);

        /// Sets the hold cap of a guard (`lock`, `with_lock`): its watchdog
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

/// Ends a wait from another thread: cheap to clone, `Send + Sync`; every
/// clone cancels the same calls.
///
/// Give it to calls with [`LockOptions::cancel`], and call
/// [`cancel`](Self::cancel) from anywhere (a signal-handling thread, a
/// shutdown hook). A cancelled call starts no more rounds: a round under way
/// runs to its end (at most `io_timeout`); if it won the lock, the lock is
/// released; otherwise its clean-up goes to every node that did not refuse;
/// then the call returns [`LockError::Cancelled`](crate::LockError::Cancelled). A cancelled `extend`
/// leaves the lock as it was. Cancelling never touches a running closure of
/// [`with_lock`](crate::Redlock::with_lock) or a guard's watchdog, and stays
/// cancelled for good: later calls with it return `Cancelled` at once.
///
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{Cancel, LockError, LockOptions, Patience, Redlock};
///
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// let cancel = Cancel::new();
/// let stopper = cancel.clone();
/// std::thread::spawn(move || {
///     std::thread::sleep(Duration::from_secs(5));
///     stopper.cancel();
/// });
/// let options = LockOptions::new(Duration::from_secs(10)).patience(Patience::Forever).cancel(&cancel);
/// match locks.acquire("leader", options) {
///     Ok(lock) => { locks.release(lock)?; }
///     Err(LockError::Cancelled { .. }) => println!("stopped waiting"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), LockError>(())
/// ```
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

    /// Cancels every call given this handle (or a clone): waits end
    /// promptly, as [`Cancel`] says.
    pub fn cancel(&self) {
        let wakers = {
            let mut wakers = self.wakers();
            self.0.done.store(true, Ordering::Release);
            std::mem::take(&mut *wakers)
        };
        wakers.into_iter().for_each(|wake| wake());
        self.0.rang.notify_all();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.done.load(Ordering::Acquire)
    }

    fn wakers(&self) -> MutexGuard<'_, Vec<Waker>> {
        self.0.wakers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `wake` on cancellation (at once if cancelled already), until
    /// the returned registration is dropped.
    pub(crate) fn on_cancel(&self, wake: Waker) -> Registered<'_> {
        let mut wakers = self.wakers();
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
        let _ = (self.0.rang).wait_timeout_while(self.wakers(), left, |_| !self.is_cancelled());
    }
}

/// A waker registered with [`Cancel::on_cancel`], removed when dropped.
pub(crate) struct Registered<'a> {
    cancel: &'a Cancel,
    wake: Waker,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.cancel
            .wakers()
            .retain(|other| !Arc::ptr_eq(other, &self.wake));
    }
}
