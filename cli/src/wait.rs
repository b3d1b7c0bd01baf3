//! Waiting for a lock: one attempt at a time, with pauses that a signal
//! cuts short.
//!
//! The library's `acquire` and `lock` sleep between their retries where no
//! signal can reach them, so the tool runs one-round attempts
//! (`try_acquire`, `try_lock` and their fenced forms) in this loop
//! instead, and pauses by waiting for a signal with a timeout.

use std::time::{Duration, Instant};

use redlock_sync::{LockError, Token};

use crate::args::Acquisition;
use crate::events::Events;
use crate::exit::Failure;

/// How long to keep trying, and how to pause between attempts.
#[derive(Debug, Clone)]
pub struct Patience {
    /// The last attempt starts at this; `None`: no limit.
    deadline: Option<Instant>,
    /// One attempt only.
    once: bool,
    /// The fixed part of the pause; up to half as much again is added at
    /// random.
    delay: Duration,
    /// The exit code when the lock is held by another client.
    conflict: u8,
    verbose: bool,
}

impl Patience {
    /// The patience `--wait`, `--no-wait`, `--retry-delay` and
    /// `--conflict-exit-code` ask for, counted from now.
    pub fn new(args: &Acquisition) -> Patience {
        Patience {
            deadline: args.wait.and_then(|wait| Instant::now().checked_add(wait)),
            once: args.no_wait,
            delay: args.retry_delay,
            conflict: args.conflict_exit_code,
            verbose: args.verbose,
        }
    }

    /// The failure for a library error, with this wait's conflict code.
    pub fn failure(&self, e: LockError) -> Failure {
        Failure::from_lock(e, self.conflict)
    }
}

/// One attempt's outcome.
pub enum Tried<T> {
    /// The lock was had (and maybe used and released): done.
    Had(T),
    /// The lock was not had, for this reason.
    NotHad(LockError),
}

impl<T> From<Result<T, LockError>> for Tried<T> {
    /// A one-round attempt's result: had, or not had for its error.
    fn from(attempt: Result<T, LockError>) -> Tried<T> {
        match attempt {
            Ok(value) => Tried::Had(value),
            Err(e) => Tried::NotHad(e),
        }
    }
}

/// Runs `attempt` until it has the lock, fails for a reason that waiting
/// cannot mend, the wait runs out, or a stop signal arrives (then at once:
/// the pause between attempts is a wait for a signal).
///
/// # Errors
///
/// The last attempt's error as a [`Failure`] (held by another: the
/// conflict code; too few nodes: the nodes code), or
/// [`Failure::interrupted`].
pub fn keep_trying<T>(
    patience: &Patience,
    events: &Events,
    resource: &str,
    mut attempt: impl FnMut() -> Tried<T>,
) -> Result<T, Failure> {
    let started = Instant::now();
    let mut said_waiting = false;
    loop {
        let e = match attempt() {
            Tried::Had(value) => return Ok(value),
            Tried::NotHad(e) => e,
        };
        let retryable = matches!(
            e,
            LockError::Contended { .. } | LockError::NoQuorum { .. } | LockError::TooSlow { .. }
        );
        if !retryable || patience.once {
            return Err(patience.failure(e));
        }
        let mut pause = patience.delay.saturating_add(jitter(patience.delay / 2));
        if let Some(deadline) = patience.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let waited = humantime::format_duration(round_ms(started.elapsed()));
                return Err(patience.failure(e).context(format_args!(
                    "gave up waiting for `{resource}` after {waited}"
                )));
            }
            // One last attempt as the wait runs out.
            pause = pause.min(left);
        }
        if patience.verbose && !said_waiting {
            eprintln!("redlock: waiting for `{resource}`: {e}");
            said_waiting = true;
        }
        if let Some(signal) = events.stop_within(pause) {
            return Err(Failure::interrupted(
                signal,
                &format!("while waiting for `{resource}`"),
            ));
        }
    }
}

/// A random duration below `max`, from the library's token source (the
/// operating system's); none if that fails, which only costs the spread.
fn jitter(max: Duration) -> Duration {
    let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    match Token::random() {
        Ok(token) if max_ns > 0 => {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&token.as_bytes()[..8]);
            Duration::from_nanos(u64::from_le_bytes(bytes) % max_ns)
        }
        _ => Duration::ZERO,
    }
}

/// `d` to whole milliseconds, for messages.
pub fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX))
}
