//! The retry policy: the one place where a pause between two rounds is
//! planned, for every operation that waits (acquisitions, `extend`, the
//! watchdog of a guard).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::setters::setters;
use crate::time::{later, random_below};
use crate::wait::Wake;

/// The backoff of a [`RetryPolicy`]: the pause after a given attempt.
#[derive(Clone)]
struct Backoff(Arc<dyn Fn(u32) -> Duration + Send + Sync>);

/// A closure shows as `custom`.
impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("custom")
    }
}

/// How many times a round that did not succeed is tried again, and how long
/// to pause before each retry.
///
/// The default: 3 retries, each after a pause drawn from `[200 ms, 300 ms)`
/// (a fixed delay plus a random jitter, so that contending clients spread
/// out). A waiting acquisition also tries within a pause when it hears of a
/// release (see [`Redlock::acquire`](crate::Redlock::acquire)). Set it on
/// the client with [`RedlockBuilder::retry_policy`](crate::RedlockBuilder::retry_policy);
/// a call's [`Patience`](crate::Patience) decides how long it goes on.
///
/// ```
/// use std::time::Duration;
/// use redlock_sync::{Redlock, RetryPolicy};
///
/// // Exponential backoff from 50 ms, at most 2 s, for ten retries.
/// let policy = RetryPolicy::default()
///     .retries(10)
///     .backoff(|attempt| (Duration::from_millis(50) * 2u32.saturating_pow(attempt)).min(Duration::from_secs(2)));
/// assert_eq!(policy.pause(1), Duration::from_millis(100));
/// let locks = Redlock::builder(["redis://127.0.0.1:7001"]).retry_policy(policy).build()?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RetryPolicy {
    pub(crate) retries: u32,
    pub(crate) delay: Duration,
    pub(crate) jitter: Duration,
    backoff: Option<Backoff>,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            retries: 3,
            delay: Duration::from_millis(200),
            jitter: Duration::from_millis(100),
            backoff: None,
        }
    }
}

impl RetryPolicy {
    setters! {
        /// Sets how many retries follow the first attempt. Defaults to 3.
        retries(retries: u32) => retries = retries;

        /// Sets the fixed part of the pause. Zero is allowed. Defaults to
        /// 200 ms.
        delay(delay: Duration) => delay = delay;

        /// Sets the random part of the pause: it is drawn from `[delay, delay +
        /// jitter)`. Zero is allowed. Defaults to 100 ms.
        jitter(jitter: Duration) => jitter = jitter;

        /// Replaces the delay and jitter by `backoff`, which gives the pause
        /// after attempt number `n`, from 1 to the retry count (the first
        /// attempt is 1). Defaults to none.
        ///
        /// It runs on the thread that waits: the caller's in `acquire`,
        /// `lock` and `extend`, where a panic in it reaches the caller; the
        /// client's watchdog thread after a guard's failed extension, where
        /// a panic ends only that guard ([`LockError::Panicked`](crate::LockError::Panicked):
        /// it releases its lock), and where it is asked for
        /// the last retry's pause again once the retries are used up (the
        /// watchdog tries while validity is left). Keep it quick, and never
        /// block in it: on the watchdog, it delays every guard's extension.
        backoff(backoff: impl Fn(u32) -> Duration + Send + Sync + 'static) => backoff = Some(Backoff(Arc::new(backoff)));
    }

    /// The pause of a caller that goes on trying past the retry count (a
    /// guard's watchdog, while validity is left): after attempt `attempt`,
    /// or after the last retry once past it. `None` with no retries.
    pub(crate) fn pause_capped(&self, attempt: u32) -> Option<Duration> {
        (self.retries > 0).then(|| self.pause(attempt.min(self.retries)))
    }

    /// The pause after attempt number `attempt` (from 1): the backoff's, or
    /// one drawn from `[delay, delay + jitter)`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use redlock_sync::RetryPolicy;
    /// let pause = RetryPolicy::default().pause(1);
    /// assert!(pause >= Duration::from_millis(200) && pause < Duration::from_millis(300));
    /// ```
    pub fn pause(&self, attempt: u32) -> Duration {
        match &self.backoff {
            Some(backoff) => (backoff.0)(attempt),
            None => self.delay.saturating_add(random_below(self.jitter)),
        }
    }
}

/// The pause of a waiting acquisition, as news of releases cuts it short:
/// the wake-up state of `acquire`'s loop, kept apart from the loop.
#[derive(Debug, Default)]
pub(crate) struct Pause {
    /// The pause under way: its end, and whether the wait budget ends it.
    under_way: Option<(Instant, bool)>,
    /// The wait under way ends soon after news, before the pause does.
    soon: bool,
    /// The last attempt followed a hint (a release heard of, the
    /// subscription coming up). A release reaches the nodes at slightly
    /// different times, and the node listened on may have said so (it
    /// publishes where the key is absent too) before the nodes that held the
    /// key deleted it; and news that came just as the subscription came up,
    /// before the attempt it set off started, wakes nobody after that
    /// attempt. An attempt that then lost is tried once more soon, not
    /// after the rest of the pause, since the other nodes' news never
    /// reaches this listener.
    after_news: bool,
}

impl Pause {
    /// Whether the attempt about to start is one the policy counts: the
    /// first, and one once the pause is over, however it was woken.
    /// Attempts made at news within a pause come on top.
    pub(crate) fn counts_next_attempt(&mut self) -> bool {
        if self.under_way.is_none_or(|(end, _)| Instant::now() >= end) {
            // A new pause; whether the last attempt followed news stays.
            (self.under_way, self.soon) = (None, false);
            return true;
        }
        false
    }

    /// Plans the wait after the failed attempt number `attempts`: the rest
    /// of the pause under way, or a new one from `policy`, never past
    /// `deadline`. Returns when the wait ends, or `None` when the retries
    /// are used up.
    pub(crate) fn plan(
        &mut self,
        policy: &RetryPolicy,
        (attempts, retries): (u32, u32),
        deadline: Option<Instant>,
        io: Duration,
    ) -> Option<Instant> {
        let (until, last) = match self.under_way {
            Some(under_way) if Instant::now() < under_way.0 => under_way,
            _ if attempts > retries => return None,
            _ => {
                let end = later(Instant::now(), policy.pause(attempts));
                match deadline {
                    Some(deadline) if deadline <= end => (deadline, true),
                    _ => (end, false),
                }
            }
        };
        self.under_way = Some((until, last));
        // Spread over half an io_timeout more: the waiters that one
        // subscription woke together do not all come back together.
        let soon = (self.after_news)
            .then(|| later(Instant::now(), io + random_below(io / 2)))
            .filter(|&soon| soon < until);
        self.soon = soon.is_some();
        Some(soon.unwrap_or(until))
    }

    /// Takes in why the planned wait ended; returns false when the wait
    /// budget is used up: no attempt starts past it, even one that news
    /// woke.
    pub(crate) fn woken(&mut self, wake: Wake) -> bool {
        self.after_news = wake != Wake::TimedOut;
        let Some((until, last)) = self.under_way else {
            return true;
        };
        // Woken, or back soon after news: the same pause goes on.
        if wake == Wake::TimedOut && !self.soon {
            self.under_way = None;
        }
        !(last && Instant::now() >= until)
    }
}
