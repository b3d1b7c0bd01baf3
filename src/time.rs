//! Time helpers: a checked TTL, a deadline that never overflows, a random pause.

use std::time::{Duration, Instant};

/// `t + d`, or a year after `t` where that overflows (a `Duration::MAX` delay, budget or TTL).
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(365 * 86_400))
}

/// A random duration in `[0, bound)`.
pub(crate) fn random_below(bound: Duration) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(getrandom::u64().unwrap_or(0) % nanos)
}

/// A checked TTL in whole milliseconds, Redis' unit. Validity is measured on it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ttl(u64);

impl Ttl {
    /// `ttl` cut to whole milliseconds.
    pub(crate) fn whole_ms(ttl: Duration) -> Ttl {
        Ttl(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn ms(self) -> u64 {
        self.0
    }

    pub(crate) fn duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}
