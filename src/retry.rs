//! The retry policy: the one planner of the pauses between rounds, for
//! acquisitions, `extend` and the watchdog.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::setters::setters;
use crate::time::{later, random_below};
use crate::wait::Wake;

/// The backoff of a [`RetryPolicy`]: the pause after a given attempt.
#[derive(Clone)]
struct Backoff(Arc<dyn Fn(u32) -> Duration + Send + Sync>);

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("custom")
    }
}

/// How many times a failed round is tried again, and the pause before each
/// retry.
///
/// By default: 3 retries, each after a pause drawn from `[200 ms, 300 ms)`.
/// The random part spreads contending clients out. A call's
/// [`Patience`](crate::Patience) decides how long it goes on.
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

        /// Sets the random part: the pause is drawn from `[delay, delay +
        /// jitter)`. Zero is allowed. Defaults to 100 ms.
        jitter(jitter: Duration) => jitter = jitter;

        /// Replaces the delay and jitter by `backoff`: the pause after attempt
        /// `n`, from 1 to the retry count.
        ///
        /// It runs on the waiting thread. In `acquire`, `lock` and `extend`,
        /// that is the caller's, and a panic reaches the caller. After a
        /// guard's failed extension, it is the watchdog. A panic there ends
        /// only that guard ([`LockError::Panicked`](crate::LockError::Panicked)).
        /// The watchdog asks for the last retry's pause again once the
        /// retries are used up. Keep it quick: on the watchdog, it delays
        /// every guard. Defaults to none.
        backoff(backoff: impl Fn(u32) -> Duration + Send + Sync + 'static) => backoff = Some(Backoff(Arc::new(backoff)));
    }

    /// When an extension that failed `failures` times in a row tries again,
    /// never at or past `until`. [`Retries::Counted`]: after the pause,
    /// while retries are left. [`Retries::WhileValid`]: after the pause for
    /// at most the retry count, cut to half the time left, never at once.
    pub(crate) fn next_extension(
        &self,
        failures: u32,
        retries: Retries,
        until: Option<Instant>,
    ) -> Option<Instant> {
        let now = Instant::now();
        let left = until.map(|until| until.saturating_duration_since(now));
        let pause = match retries {
            Retries::Counted(n) if failures > n => return None,
            Retries::Counted(_) => self.pause(failures),
            Retries::WhileValid => {
                let half = left.filter(|left| !left.is_zero())? / 2;
                let asked = (self.retries > 0).then(|| self.pause(failures.min(self.retries)));
                let pause = asked.map_or(half, |pause| pause.min(half));
                pause.max(Duration::from_millis(1))
            }
        };
        let at = later(now, pause);
        until.is_none_or(|until| at < until).then_some(at)
    }

    /// The pause after attempt number `attempt` (from 1): the backoff's, or
    /// one drawn from `[delay, delay + jitter)`.
    pub fn pause(&self, attempt: u32) -> Duration {
        match &self.backoff {
            Some(backoff) => (backoff.0)(attempt),
            None => self.delay.saturating_add(random_below(self.jitter)),
        }
    }
}

/// How long a failed extension is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retries {
    /// Up to this many retries (`extend`).
    Counted(u32),
    /// While validity is left (a guard's watchdog).
    WhileValid,
}

/// The pause of a waiting acquisition, as news of releases cuts it short.
#[derive(Debug, Default)]
pub(crate) struct Pause {
    /// The pause under way: its end, and whether the wait budget ends it.
    under_way: Option<(Instant, bool)>,
    /// The wait under way ends soon after news, before the pause does.
    soon: bool,
    /// The last attempt followed news: if it lost, try again soon, not
    /// after the rest of the pause (see [`Patience`](crate::Patience)).
    after_news: bool,
}

impl Pause {
    /// Whether the policy counts the attempt about to start. It counts the
    /// first, and one once the pause is over, however it was woken. Attempts
    /// made at news within a pause come on top.
    pub(crate) fn counts_next_attempt(&mut self) -> bool {
        let new = self.under_way.is_none_or(|(end, _)| Instant::now() >= end);
        if new {
            // A new pause; whether the last attempt followed news stays.
            (self.under_way, self.soon) = (None, false);
        }
        new
    }

    /// Plans the wait after the failed attempt number `attempts`. It is the
    /// rest of the pause under way, or a new one, never past `deadline`.
    /// `None` once the retries are used up.
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
                (deadline.filter(|&d| d <= end)).map_or((end, false), |d| (d, true))
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

    /// Takes in why the wait ended. Returns false once the wait budget is
    /// used up: no attempt starts past it, even one that news woke.
    pub(crate) fn woken(&mut self, wake: Wake) -> bool {
        self.after_news = wake != Wake::TimedOut;
        let over = (self.under_way).is_some_and(|(until, last)| last && Instant::now() >= until);
        // Woken, or back soon after news: the same pause goes on.
        if !self.after_news && !self.soon {
            self.under_way = None;
        }
        !over
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const MS: Duration = Duration::from_millis(1);

    /// A policy whose backoff records what it is asked, and answers `n` ms.
    fn recording(retries: u32) -> (RetryPolicy, Arc<Mutex<Vec<u32>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&asked);
        let policy = RetryPolicy::default().retries(retries).backoff(move |n| {
            record.lock().unwrap().push(n);
            MS * n
        });
        (policy, asked)
    }

    #[test]
    fn extend_retries_while_its_count_lasts_and_the_pause_ends_before_the_validity() {
        let (policy, asked) = recording(2);
        let far = Some(Instant::now() + Duration::from_secs(60));
        assert!(policy.next_extension(2, Retries::Counted(2), far).is_some());
        assert_eq!(policy.next_extension(3, Retries::Counted(2), far), None);
        assert_eq!(*asked.lock().unwrap(), [2], "not asked past the count");
        let soon = Some(Instant::now() + MS);
        assert_eq!(policy.next_extension(2, Retries::Counted(2), soon), None);
    }

    #[test]
    fn the_watchdog_retries_while_valid_within_half_the_time_left_asking_at_most_the_retry_count() {
        let (policy, asked) = recording(3);
        let until = Instant::now() + Duration::from_secs(60);
        let at = policy
            .next_extension(9, Retries::WhileValid, Some(until))
            .unwrap();
        assert!(at <= Instant::now() + 3 * MS, "the pause for attempt 3");
        assert_eq!(*asked.lock().unwrap(), [3], "never past the retry count");
        // Half the time left, whatever the pause; never at once.
        let slow = RetryPolicy::default()
            .delay(Duration::from_secs(100))
            .jitter(Duration::ZERO);
        let until = Instant::now() + Duration::from_millis(400);
        let at = slow
            .next_extension(1, Retries::WhileValid, Some(until))
            .unwrap();
        assert!(at <= Instant::now() + Duration::from_millis(200));
        let now = Instant::now();
        let at = recording(0)
            .0
            .next_extension(1, Retries::WhileValid, Some(now + 4 * MS));
        assert!(
            at.is_some_and(|at| at > now),
            "no retries: half the time left"
        );
        assert_eq!(
            policy.next_extension(1, Retries::WhileValid, Some(now)),
            None
        );
    }

    #[test]
    fn an_acquisitions_pause_goes_on_when_news_wakes_it_and_ends_at_the_deadline() {
        let policy = RetryPolicy::default()
            .retries(5)
            .backoff(|_| Duration::from_secs(60));
        let mut pause = Pause::default();
        assert!(pause.counts_next_attempt(), "the first attempt counts");
        let end = pause.plan(&policy, (1, 5), None, MS).unwrap();
        // News within the pause: the next attempt comes on top, and the
        // wait after it is the rest of the same pause, or sooner.
        assert!(pause.woken(Wake::Heard));
        assert!(!pause.counts_next_attempt());
        assert!(pause
            .plan(&policy, (1, 5), None, MS)
            .is_some_and(|again| again <= end));
        // Past the retries, no pause.
        assert_eq!(Pause::default().plan(&policy, (6, 5), None, MS), None);
        // A deadline before the pause's end ends the wait, and then the call.
        let mut capped = Pause::default();
        let deadline = Instant::now() + Duration::from_micros(1);
        let _ = capped.plan(&policy, (1, 5), Some(deadline), MS);
        std::thread::sleep(MS);
        assert!(!capped.woken(Wake::TimedOut), "the wait budget is used up");
    }
}
