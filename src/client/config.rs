//! The settings of a [`Redlock`](crate::Redlock), their defaults and limits,
//! and [`RedlockBuilder`], which changes them.
//!
//! The builder checks the settings; turning them into nodes and a client is
//! `build`'s job, next to the client it builds.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{ArgumentError, ConfigError, LockError};
use crate::event::{Event, Observer};
use crate::node::Endpoint;
use crate::request::{Cancel, LockOptions, Patience};
use crate::retry::RetryPolicy;
use crate::setters::setters;
use crate::time::later;

/// The largest TTL accepted: Redis rejects expiry times that overflow a
/// signed 64-bit count of milliseconds since the epoch; half of that range
/// leaves room for any clock.
///
/// ```
/// # use std::time::Duration;
/// use redlock_sync::{ArgumentError, LockError, Redlock, MAX_TTL};
///
/// let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// let too_long = MAX_TTL + Duration::from_millis(1);
/// assert!(matches!(
///     locks.try_acquire("r", too_long),
///     Err(LockError::Argument(ArgumentError::TtlTooLarge { .. }))
/// ));
/// # Ok::<(), LockError>(())
/// ```
pub const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The largest `io_timeout` and `connect_timeout` accepted: a round that may
/// take longer than an hour is no lock round.
///
/// ```
/// # use std::time::Duration;
/// use redlock_sync::{ConfigError, LockError, Redlock, MAX_TIMEOUT};
///
/// let built = Redlock::builder(["redis://127.0.0.1:7001"])
///     .io_timeout(MAX_TIMEOUT + Duration::from_secs(1))
///     .build();
/// assert!(matches!(built, Err(LockError::Config(ConfigError::TimeoutTooLarge { .. }))));
/// ```
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The settings of a [`Redlock`](crate::Redlock), with their defaults.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) retry: RetryPolicy,
    pub(crate) drift_factor: f64,
    pub(crate) io_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// `with_lock` extends when this share of the validity is left.
    pub(crate) extend_when_left: f64,
    /// `with_lock` never extends the validity past this long after the
    /// acquisition.
    pub(crate) max_hold: Option<Duration>,
    /// `acquire` starts no attempt (and sleeps no pause) past this long.
    pub(crate) max_wait: Option<Duration>,
    /// A node up for less than this does not vote (zero: no check).
    pub(crate) restart_grace: Duration,
    pub(crate) observer: Option<Observer>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            retry: RetryPolicy::default(),
            drift_factor: 0.01,
            io_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(50),
            extend_when_left: 1.0 / 3.0,
            max_hold: None,
            max_wait: None,
            restart_grace: Duration::ZERO,
            observer: None,
        }
    }
}

impl Config {
    /// How long a node waits to connect again after a connect timed out: ten
    /// round deadlines, within [100 ms, 2 s]. A node that accepts connections
    /// but never answers then costs one round in ten a deadline, not every one.
    pub(crate) fn reconnect_backoff(&self) -> Duration {
        (self.io_timeout * 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }
}

/// Builds a [`Redlock`](crate::Redlock) with settings other than the
/// defaults. Each setter says what it changes and its default; nothing is
/// checked, and nothing connected, until [`build`](Self::build).
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_sync::{Redlock, RetryPolicy};
///
/// let locks = Redlock::builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .retry_policy(RetryPolicy::default().retries(5).delay(Duration::from_millis(100)))
///     .drift_factor(0.01)
///     .io_timeout(Duration::from_millis(200))
///     .connect_timeout(Duration::from_millis(200))
///     .max_wait(Duration::from_secs(5))
///     .extend_when_left(1.0 / 3.0)
///     .max_hold(Duration::from_secs(600))
///     .build()?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
///
/// Its `Debug` output shows the node URLs with their passwords replaced by
/// `***`, and every setting.
#[derive(Clone)]
#[must_use = "a builder does nothing until .build()"]
pub struct RedlockBuilder {
    urls: Vec<String>,
    config: Config,
}

impl fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| Endpoint::redact(u)).collect();
        (f.debug_struct("RedlockBuilder"))
            .field("nodes", &urls)
            .field("settings", &self.config)
            .finish()
    }
}

impl RedlockBuilder {
    setters! {
        /// Sets the retry policy: how many times a round that did not succeed
        /// is tried again (by the acquisitions when the lock was not won, by
        /// [`extend`](crate::Redlock::extend) when too few nodes answered),
        /// and the pause before each try (see [`RetryPolicy`]). Defaults to
        /// [`RetryPolicy::default`]: 3 retries, 200 ms to 300 ms apart.
        retry_policy(policy: RetryPolicy) => config.retry = policy;

        /// Sets the share of the TTL set aside for clock drift between
        /// processes: `validity = ttl - elapsed - (ttl * drift_factor + 2 ms)`.
        /// Must be in `[0, 1)`. Defaults to 0.01.
        drift_factor(factor: f64) => config.drift_factor = factor;

        /// Sets the bound on one round's network I/O: a round's deadline is
        /// this long after it begins, and a node that has not answered by then
        /// counts as failed. Keep it small next to the TTL, and above three
        /// round trips to your nodes: a round that must (re)connect spends one
        /// on the TCP connect and one on the handshake before its command. At
        /// most [`MAX_TIMEOUT`]. Defaults to 50 ms, for nodes in the same
        /// datacenter.
        io_timeout(timeout: Duration) => config.io_timeout = timeout;

        /// Sets the bound on opening one connection: resolving a host name (for
        /// `redis://`; over TLS the `redis` crate resolves it, unbounded), TCP
        /// connect, then one round trip for `AUTH` and `SELECT` if the URL asks
        /// for them, `SCRIPT LOAD` for the scripts, and `INFO server` (the
        /// server's `run_id`, and its uptime for the restart guard). A connect
        /// never runs past its round's deadline either. At most
        /// [`MAX_TIMEOUT`]. Defaults to 50 ms.
        connect_timeout(timeout: Duration) => config.connect_timeout = timeout;

        /// Sets a bound on the total time [`acquire`](crate::Redlock::acquire)
        /// (and the acquisition in [`with_lock`](crate::Redlock::with_lock))
        /// spends waiting: no attempt starts, and no pause is slept, past `wait`
        /// after the call began. [`extend`](crate::Redlock::extend) starts no
        /// retry past it either. The first attempt always runs, so a zero budget
        /// means one attempt. The retry count still applies as well; set it high
        /// to let the budget alone decide. These are the defaults of every call:
        /// a call's [`LockOptions::patience`](crate::LockOptions::patience)
        /// replaces both for that call. Defaults to none: the retry count alone
        /// decides.
        ///
        /// ```no_run
        /// # use redlock_sync::{Redlock, RetryPolicy};
        /// # use std::time::Duration;
        /// // Keep trying for up to 5 s, every 50 to 100 ms.
        /// let pace = Duration::from_millis(50);
        /// let locks = Redlock::builder(["redis://127.0.0.1:7001"])
        ///     .retry_policy(RetryPolicy::default().retries(u32::MAX).delay(pace).jitter(pace))
        ///     .max_wait(Duration::from_secs(5))
        ///     .build()?;
        /// # Ok::<(), redlock_sync::LockError>(())
        /// ```
        max_wait(wait: Duration) => config.max_wait = Some(wait);

        /// Sets when the watchdog of [`with_lock`](crate::Redlock::with_lock)
        /// extends the lock: once only this share of its validity is left (the
        /// validity measured by the acquisition or the last extension, which is
        /// the TTL minus the round's time and the drift term). Must be in
        /// `(0, 1)`; keep `ttl * fraction` well above `io_timeout`. Defaults to
        /// 1/3, so a lock with a 30 s TTL is extended when about 10 s are left,
        /// which leaves room for a few retries of a failed extension.
        extend_when_left(fraction: f64) => config.extend_when_left = fraction;

        /// Sets a cap on how long [`with_lock`](crate::Redlock::with_lock)
        /// holds a lock: the watchdog never extends the validity past
        /// `max_hold` after the acquisition (the last extension is shortened to
        /// end there), and then stops extending;
        /// [`LockGuard::is_ending`](crate::LockGuard::is_ending) turns true. A
        /// cap shorter than the TTL means no extension at all.
        ///
        /// Without a cap, a closure that hangs (a deadlock, a stuck network
        /// call) keeps the lock alive for as long as its process runs, and
        /// every other client waits that long: set a cap above the longest time
        /// the work may legitimately take. Defaults to none.
        ///
        /// ```no_run
        /// # use redlock_sync::Redlock;
        /// # use std::time::Duration;
        /// // A nightly job takes 20 minutes at most; never block others for more
        /// // than an hour, even if it hangs.
        /// let locks = Redlock::builder(["redis://127.0.0.1:7001"])
        ///     .max_hold(Duration::from_secs(3600))
        ///     .build()?;
        /// # Ok::<(), redlock_sync::LockError>(())
        /// ```
        max_hold(max_hold: Duration) => config.max_hold = Some(max_hold);

        /// Calls `observer` with an [`Event`] for each change: an acquisition
        /// that starts failing and how it ends (won, or given up), a node that
        /// fails or answers again, a guard's extensions (and a run of failed
        /// ones, which it retries), the loss of a guard's lock, and each
        /// release; not one event a round (see [`What`](crate::What)), but each
        /// with a count of the failed rounds. It runs inline, on the thread doing the operation (for a guard's
        /// extensions and losses, the watchdog): keep it quick, never block in
        /// it, and never call the client from it. A panic in it is caught and
        /// does not reach the lock. Defaults to none; with none, no event is
        /// built.
        ///
        /// The crate has no logging dependency: hand the events to yours.
        ///
        /// ```
        /// use std::sync::atomic::{AtomicU64, Ordering};
        /// use std::sync::Arc;
        /// use redlock_sync::{Redlock, What};
        ///
        /// let contended = Arc::new(AtomicU64::new(0));
        /// let count = Arc::clone(&contended);
        /// let locks = Redlock::builder(["redis://127.0.0.1:7001"])
        ///     .observer(move |event| {
        ///         if event.what == What::Contended {
        ///             count.fetch_add(1, Ordering::Relaxed);
        ///         }
        ///         // With the `log` crate: log::debug!("{event:?}");
        ///         // with `tracing`: tracing::debug!(resource = event.resource, what = ?event.what, "redlock");
        ///     })
        ///     .build()?;
        /// # Ok::<(), redlock_sync::LockError>(())
        /// ```
        observer(observer: impl Fn(&Event<'_>) + Send + Sync + 'static) => config.observer = Some(Observer(std::sync::Arc::new(observer)));

        /// Sets the restarted-node guard: a node that has been up for less than
        /// `grace` does not vote.
        ///
        /// A node that restarts without persistence forgets its locks; if it
        /// voted at once, another client could win a quorum that includes it
        /// while the first client still holds the lock on the other nodes. With
        /// a grace period, every new connection reads the node's uptime with
        /// `INFO server` (pipelined with the handshake: no extra round trip),
        /// and while the uptime is below `grace` the node is reported as failed
        /// with [`NodeError::Restarted`](crate::NodeError::Restarted) and gets
        /// no command. Once its uptime reaches `grace`, it votes again: a later
        /// round simply reconnects.
        ///
        /// Set `grace` to at least the longest TTL you pass to `acquire` or
        /// `extend` (the locks a restarted node forgot have all expired by then),
        /// plus a margin for clock rate differences. The uptime has whole-second
        /// resolution; the guard takes the least the real uptime can be (a
        /// second less than reported), so a node is kept out up to about two
        /// seconds longer than `grace`, never shorter. And the node's clock may
        /// be stepped after it started (time sync after a boot with a wrong
        /// clock), which makes its uptime jump: so once this client has seen a
        /// node restart (a `run_id` other than the one it reached before, or an
        /// uptime below the grace), it keeps the node out for the whole grace
        /// from then on its own monotonic clock, whatever uptime the node
        /// reports later. A client that first meets the node after such a step
        /// has only the node's word. What locks held across restarts need, and
        /// why eviction is a restart too, is in
        /// [`Redlock::extend`](crate::Redlock::extend). A node whose `INFO`
        /// command is disabled or answers without an uptime never votes while
        /// the guard is on. The check relies on a restarted server being
        /// reachable only through new connections, which holds for direct
        /// connections and plain TCP proxies; a connection pooler that keeps
        /// the client's connection while it reconnects to a restarted server
        /// behind it would hide the restart.
        ///
        /// Nodes that run with `appendonly yes` and `appendfsync always` keep
        /// their locks across restarts and do not need the guard. It does not
        /// help against data lost without a restart (`FLUSHALL`, a failover to
        /// a replica that had not caught up). It is off unless set because the
        /// right value depends on the longest TTL, which only you know, and
        /// because a guard that is too long makes every freshly started node (a
        /// new deployment, a test cluster) refuse to vote for that long.
        /// Defaults to zero: off.
        ///
        /// ```no_run
        /// use std::time::Duration;
        /// use redlock_sync::Redlock;
        ///
        /// // Locks are taken for at most 30 s (TTLs of acquire and extend).
        /// let locks = Redlock::builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
        ///     .restart_grace(Duration::from_secs(35))
        ///     .build()?;
        /// # Ok::<(), redlock_sync::LockError>(())
        /// ```
        restart_grace(grace: Duration) => config.restart_grace = grace;
    }

    /// A builder over `urls`, with the default settings.
    pub(crate) fn new(urls: Vec<String>) -> RedlockBuilder {
        RedlockBuilder {
            urls,
            config: Config::default(),
        }
    }

    /// The node URLs and the settings, once the settings are checked (the
    /// URLs are checked as the nodes are built).
    pub(crate) fn checked(self) -> Result<(Vec<String>, Config), ConfigError> {
        let config = self.config;
        if !(0.0..1.0).contains(&config.drift_factor) {
            let value = config.drift_factor;
            return Err(ConfigError::DriftFactor { value });
        }
        if !(config.extend_when_left > 0.0 && config.extend_when_left < 1.0) {
            let value = config.extend_when_left;
            return Err(ConfigError::ExtendWhenLeft { value });
        }
        for (which, timeout) in [
            ("io_timeout", config.io_timeout),
            ("connect_timeout", config.connect_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ConfigError::ZeroTimeout { which });
            }
            if timeout > MAX_TIMEOUT {
                let max = MAX_TIMEOUT;
                return Err(ConfigError::TimeoutTooLarge { which, max });
            }
        }
        if self.urls.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        Ok((self.urls, config))
    }
}

impl Config {
    /// `options` with every default filled in from these settings, for a
    /// call that began at `started`.
    pub(crate) fn call(&self, options: &LockOptions, started: Instant) -> Result<Call, LockError> {
        let config = self;
        let when_left = (options.extend_when_left).unwrap_or(config.extend_when_left);
        if !(when_left > 0.0 && when_left < 1.0) {
            return Err(ArgumentError::ExtendWhenLeft { value: when_left }.into());
        }
        let max_wait = config.max_wait.map(|wait| later(started, wait));
        let (retries, deadline) = match options.patience {
            None => (config.retry.retries, max_wait),
            Some(Patience::Retries(n)) => (n, None),
            Some(Patience::For(wait)) => (u32::MAX, Some(later(started, wait))),
            Some(Patience::Until(deadline)) => (u32::MAX, Some(deadline)),
            Some(Patience::Forever) => (u32::MAX, None),
        };
        Ok(Call {
            retries,
            deadline,
            max_hold: options.max_hold.or(config.max_hold),
            extend_when_left: when_left,
            cancel: options.cancel.clone(),
        })
    }
}

/// A call's options with the client's defaults filled in (by default: one
/// attempt, no deadline, nothing to cancel it).
#[derive(Debug, Default)]
pub(crate) struct Call {
    /// How many retries the policy may plan.
    pub(crate) retries: u32,
    /// No attempt starts, and no pause is slept, past this.
    pub(crate) deadline: Option<Instant>,
    /// A guard's hold cap, from its acquisition.
    pub(crate) max_hold: Option<Duration>,
    pub(crate) extend_when_left: f64,
    pub(crate) cancel: Option<Cancel>,
}

impl Call {
    /// Whether the call was cancelled.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(Cancel::is_cancelled)
    }

    /// Sleeps until `until`, or until the call is cancelled.
    pub(crate) fn sleep_until(&self, until: Instant) {
        match &self.cancel {
            Some(cancel) => cancel.sleep_until(until),
            None => std::thread::sleep(until.saturating_duration_since(Instant::now())),
        }
    }
}
