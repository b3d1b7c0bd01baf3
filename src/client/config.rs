//! The settings of a [`Redlock`](crate::Redlock), their limits, and
//! [`RedlockBuilder`], which checks them. `build`, in `client.rs`, makes
//! the nodes.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{ArgumentError, ConfigError, LockError};
use crate::event::{Event, Observer};
use crate::node::redact;
use crate::request::{Cancel, LockOptions, Patience};
use crate::retry::RetryPolicy;
use crate::setters::setters;
use crate::time::later;

/// The largest TTL accepted: 2^52 ms, about 142,000 years. Shared and
/// counted locks keep expiry times as doubles, exact below 2^53 ms since
/// the epoch; the rest of that range leaves room for any clock.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 52);

/// The largest `io_timeout` and `connect_timeout` accepted: a round that
/// may take longer than an hour is no lock round.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The settings of a [`Redlock`](crate::Redlock), as the setters of
/// [`RedlockBuilder`] document them.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) retry: RetryPolicy,
    pub(crate) drift_factor: f64,
    pub(crate) io_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) extend_when_left: f64,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) max_wait: Option<Duration>,
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
    /// How long a node waits to connect again after a connect timed out. It
    /// is ten round deadlines, within [100 ms, 2 s]. So a node that accepts
    /// connections but never answers costs one round in ten a deadline.
    pub(crate) fn reconnect_backoff(&self) -> Duration {
        (self.io_timeout * 10).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }
}

/// Builds a [`Redlock`](crate::Redlock) with settings other than the
/// defaults. Nothing is checked or connected until [`build`](Self::build).
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
/// `Debug` shows the node URLs with `***` for passwords.
#[derive(Clone)]
#[must_use = "a builder does nothing until .build()"]
pub struct RedlockBuilder {
    urls: Vec<String>,
    config: Config,
}

impl fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact(u)).collect();
        (f.debug_struct("RedlockBuilder"))
            .field("nodes", &urls)
            .field("settings", &self.config)
            .finish()
    }
}

impl RedlockBuilder {
    setters! {
        /// Sets the retry policy: how often a failed round is tried again,
        /// and after which pauses ([`RetryPolicy`]). The acquisitions and
        /// [`extend`](crate::Redlock::extend) follow it. Defaults to
        /// [`RetryPolicy::default`].
        retry_policy(policy: RetryPolicy) => config.retry = policy;

        /// Sets the share of the TTL set aside for clock drift between
        /// processes: `validity = ttl - elapsed - (ttl * drift_factor + 2 ms)`.
        /// Must be in `[0, 1)`. Defaults to 0.01.
        drift_factor(factor: f64) => config.drift_factor = factor;

        /// Sets the deadline of one round, from its start. A node that has not
        /// answered by then counts as failed. Keep it small next to the TTL,
        /// and above three round trips. A round that must connect spends two
        /// on the connect and the handshake. At most [`MAX_TIMEOUT`]. Defaults
        /// to 50 ms.
        io_timeout(timeout: Duration) => config.io_timeout = timeout;

        /// Sets the bound on opening one connection: the host lookup, the TCP
        /// connect, and one round trip for the handshake. A connect never runs
        /// past its round's deadline either. At most [`MAX_TIMEOUT`]. Defaults
        /// to 50 ms.
        connect_timeout(timeout: Duration) => config.connect_timeout = timeout;

        /// Sets how long an acquisition may wait. No attempt starts, and no
        /// pause is slept, past `wait` after the call began.
        /// [`extend`](crate::Redlock::extend) starts no retry past it either.
        /// The first attempt always runs. The retry count still applies: set it
        /// high to let this budget decide alone. A call's
        /// [`LockOptions::patience`](crate::LockOptions::patience) replaces
        /// both. Defaults to none: the retry count alone decides.
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

        /// Sets when a guard's watchdog extends its lock: once only this share
        /// of its validity is left. Must be in `(0, 1)`. Keep `ttl * fraction`
        /// well above `io_timeout`. Defaults to 1/3: a 30 s lock is extended
        /// with about 10 s left, room for a few retries.
        extend_when_left(fraction: f64) => config.extend_when_left = fraction;

        /// Sets a cap on how long a guard holds a lock. The watchdog never
        /// extends the validity past `max_hold` after the acquisition. Then
        /// [`LockGuard::is_ending`](crate::LockGuard::is_ending) turns true. A
        /// cap shorter than the TTL means no extension at all.
        ///
        /// Without a cap, a closure that hangs keeps the lock for as long as
        /// its process runs. Set a cap above the longest time the work may
        /// take. Defaults to none.
        max_hold(max_hold: Duration) => config.max_hold = Some(max_hold);

        /// Calls `observer` with an [`Event`] for each change, not for each
        /// round (see [`What`](crate::What)). Each event counts the failed
        /// rounds so far.
        ///
        /// It runs inline on the thread doing the operation, or on the
        /// watchdog for a guard's extensions and losses. Keep it quick, never
        /// block in it, and never call the client from it. A panic in it is
        /// caught. The crate logs nothing itself: hand the events to your
        /// logger (see [the crate docs](crate#guards-and-locks)). Defaults to
        /// none.
        observer(observer: impl Fn(&Event<'_>) + Send + Sync + 'static) => config.observer = Some(Observer(std::sync::Arc::new(observer)));

        /// Sets the restart guard: a node up for less than `grace` does not
        /// vote.
        ///
        /// A node restarted without persistence forgets its locks. Voting at
        /// once, it could help another client win a lock still held. With a
        /// grace, each new connection reads the node's uptime (`INFO server`,
        /// in the handshake). Below `grace`, the node gets no command and fails
        /// with [`NodeError::Restarted`](crate::NodeError::Restarted).
        ///
        /// Set `grace` to the longest TTL you use, plus a margin for clock
        /// rates. The uptime counts whole seconds, so a node may stay out up to
        /// 2 s longer. Once this client saw a node restart, it keeps the node
        /// out for the whole grace by its own clock. So a node clock
        /// stepped after the restart does not cut the grace short. A client
        /// that first meets the node after such a step cannot tell. A node
        /// whose `INFO` gives no uptime never votes while the guard is on. A
        /// pooler that keeps the connection across a restart hides it.
        ///
        /// Nodes with `appendonly yes` and `appendfsync always` do not need the
        /// guard. It does not help against data lost without a restart (see
        /// [the contract](crate::contract)). Defaults to zero: off, as only
        /// you know the longest TTL.
        restart_grace(grace: Duration) => config.restart_grace = grace;
    }

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
        let (drift, when_left) = (config.drift_factor, config.extend_when_left);
        if !(0.0..1.0).contains(&drift) {
            return Err(ConfigError::DriftFactor { value: drift });
        }
        if !(when_left > 0.0 && when_left < 1.0) {
            return Err(ConfigError::ExtendWhenLeft { value: when_left });
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
        let when_left = (options.extend_when_left).unwrap_or(self.extend_when_left);
        if !(when_left > 0.0 && when_left < 1.0) {
            return Err(ArgumentError::ExtendWhenLeft { value: when_left }.into());
        }
        let max_wait = self.max_wait.map(|wait| later(started, wait));
        let while_held = options.patience == Some(Patience::WhileHeld);
        let (retries, deadline) = match options.patience {
            None | Some(Patience::WhileHeld) => (self.retry.retries, max_wait),
            Some(Patience::Retries(n)) => (n, None),
            Some(Patience::For(wait)) => (u32::MAX, Some(later(started, wait))),
            Some(Patience::Until(deadline)) => (u32::MAX, Some(deadline)),
            Some(Patience::Forever) => (u32::MAX, None),
        };
        Ok(Call {
            retries,
            while_held,
            deadline,
            max_hold: options.max_hold.or(self.max_hold),
            extend_when_left: when_left,
            cancel: options.cancel.clone(),
        })
    }
}

/// A call's options with the client's defaults filled in (by default: one
/// attempt, no deadline, nothing to cancel it).
#[derive(Debug, Default)]
pub(crate) struct Call {
    pub(crate) retries: u32,
    /// [`Patience::WhileHeld`]: `retries` counts only the attempts that
    /// failed otherwise than by contention, in a row.
    pub(crate) while_held: bool,
    /// No attempt starts, and no pause is slept, past this.
    pub(crate) deadline: Option<Instant>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) extend_when_left: f64,
    pub(crate) cancel: Option<Cancel>,
}

impl Call {
    /// The failed attempt number `attempts`, ended by `error`, as the
    /// retry policy counts it: `(attempt, retries)`. Waiting `WhileHeld`,
    /// an attempt that found the lock held uses up no retry, and the
    /// others count in a row (`failed_in_a_row`).
    pub(crate) fn budget(
        &self,
        error: &LockError,
        attempts: u32,
        failed_in_a_row: &mut u32,
    ) -> (u32, u32) {
        if !self.while_held {
            return (attempts, self.retries);
        }
        if let LockError::Contended { .. } = error {
            *failed_in_a_row = 0;
            let retries = self.retries.max(1);
            return (attempts.min(retries), retries);
        }
        *failed_in_a_row += 1;
        (*failed_in_a_row, self.retries)
    }

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
