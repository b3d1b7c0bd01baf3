//! Two helpers of time: a deadline that never overflows, and a random
//! pause.

use std::time::{Duration, Instant};

/// `t + d`, or a year after `t` where that is past the clock's range (a
/// `Duration::MAX` retry delay, wait budget or TTL).
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(365 * 86_400))
}

/// A random duration in `[0, bound)`.
pub(crate) fn random_below(bound: Duration) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(getrandom::u64().unwrap_or(0) % nanos)
}
