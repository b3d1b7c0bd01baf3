//! Waiting for a lock: one attempt at a time, with pauses that a signal
//! cuts short.
//!
//! The library's `acquire` and `lock` sleep between their retries where no
//! signal can reach them, so the tool runs one-round attempts
//! (`try_acquire`, `try_lock` and their fenced forms) in this loop
//! instead, and pauses by waiting for a signal with a timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_sync::{LockError, NodeOutcome, Report, Token};

use crate::args::Acquisition;
use crate::events::Events;
use crate::exit::{self, say, Failure};

/// How often, at most, a wait that keeps finding too few nodes says so
/// again: said once only, a wait that lasts hours would look like a hang;
/// said at every attempt, it would flood a log. (`redlock run --help` says
/// 10 s.)
const SAY_NODES_EVERY: Duration = Duration::from_secs(10);

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
    /// The exit code when the lock is held by another client, if given
    /// (`-E`): then that says nothing, unless `verbose`.
    conflict: Option<u8>,
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
    /// A lock held by another client is said in one short line (with
    /// `-v`: with each node's answer), or not at all with `-E` (and
    /// without `-v`): cron mails whatever a job prints.
    pub fn failure(&self, e: LockError) -> Failure {
        let held_by = match &e {
            LockError::Contended { resource, .. } if !self.verbose => Some(resource.clone()),
            _ => None,
        };
        let mut failure = Failure::from_lock(e, self.conflict.unwrap_or(exit::CONFLICT));
        if let Some(resource) = held_by {
            failure.message = format!("`{resource}` is held by another client");
            failure.quiet = self.conflict.is_some();
        }
        failure
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
    let mut nodes_down = NodesDown::default();
    let mut warned: Vec<Arc<str>> = Vec::new();
    loop {
        let e = match attempt() {
            Tried::Had(value) => return Ok(value),
            Tried::NotHad(e) => e,
        };
        if let Some(report) = e.report() {
            refusals(report, &mut warned)?;
        }
        if !matches!(e, LockError::NoQuorum { .. }) {
            nodes_down.mended();
        }
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
        // Too few nodes is said even without --verbose: without a limit
        // the wait lasts until they come back, and it must not look like
        // a hang. The library's message names the failed nodes, never a
        // password.
        if matches!(e, LockError::NoQuorum { .. }) && nodes_down.due(Instant::now()) {
            if said_waiting {
                let waited = humantime::format_duration(round_secs(started.elapsed()));
                say(format_args!(
                    "still waiting for `{resource}` after {waited}: {e}"
                ));
            } else {
                say(format_args!("waiting for `{resource}`: {e}"));
            }
            said_waiting = true;
        } else if patience.verbose && !said_waiting {
            say(format_args!("waiting for `{resource}`: {e}"));
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

/// Nodes that refuse this client (a wrong or missing password, a missing
/// ACL permission) stay so however long it waits. If they leave too few
/// nodes for a quorum, that is a failure (the refused code) at once;
/// otherwise each is said once (added to `warned`) and the wait goes on
/// with the others.
///
/// # Errors
///
/// The [`exit::REFUSED`] failure, naming each refusing node and its cause.
fn refusals(report: &Report, warned: &mut Vec<Arc<str>>) -> Result<(), Failure> {
    let refusing = refusing(report);
    if !refusing.is_empty() && report.nodes.len() - refusing.len() < report.quorum {
        let causes: Vec<String> = refusing.iter().map(|(_, cause)| cause.clone()).collect();
        return Err(Failure::new(
            exit::REFUSED,
            "refused",
            format!(
                "{} of {} nodes refuse this client, which leaves too few for a quorum of {}; \
                 waiting cannot fix that (fix the node URLs, their passwords, the ACL \
                 user's permissions, or the TLS certificates): {}",
                refusing.len(),
                report.nodes.len(),
                report.quorum,
                causes.join("; ")
            ),
        ));
    }
    for (node, cause) in refusing {
        if !warned.contains(node) {
            say(format_args!("{cause}; going on with the other nodes"));
            warned.push(node.clone());
        }
    }
    Ok(())
}

/// Says each node of `report` that refuses this client: the lock was had
/// without it, but it does not help the next time.
pub fn warn_refusals(report: &Report) {
    let _ = refusals(report, &mut Vec::new());
}

/// The nodes of `report` that cannot serve this client however long it
/// waits (the library's `NodeError::is_permanent`: a refused password, a
/// missing ACL permission, a TLS failure, a host that does not exist), each
/// with its cause. Its message names the node.
fn refusing(report: &Report) -> Vec<(&Arc<str>, String)> {
    report
        .unusable()
        .filter_map(|n| match &n.outcome {
            NodeOutcome::Failed(e) => Some((&n.node, format!("node `{}`: {e}", n.node))),
            _ => None,
        })
        .collect()
}

/// When a wait says that too few nodes answered: at the first attempt of
/// a run of such attempts, then at most once per [`SAY_NODES_EVERY`] while
/// the run lasts.
#[derive(Debug, Default)]
struct NodesDown {
    /// When it was last said in this run; `None`: not yet.
    said_at: Option<Instant>,
}

impl NodesDown {
    /// Whether an attempt at `now` that found too few nodes is to be said
    /// (and then it counts as said).
    fn due(&mut self, now: Instant) -> bool {
        let due = self
            .said_at
            .is_none_or(|at| now.saturating_duration_since(at) >= SAY_NODES_EVERY);
        if due {
            self.said_at = Some(now);
        }
        due
    }

    /// An attempt reached enough nodes: a new run is said at once.
    fn mended(&mut self) {
        self.said_at = None;
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

/// `d` to whole seconds, for messages about long waits.
fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_nodes_is_said_at_once_then_at_most_every_ten_seconds() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut nodes_down = NodesDown::default();
        assert!(nodes_down.due(at(0)));
        assert!(!nodes_down.due(at(1)));
        assert!(!nodes_down.due(at(9)));
        assert!(nodes_down.due(at(10)));
        assert!(!nodes_down.due(at(15)));
        // Back, then down again: said at once.
        nodes_down.mended();
        assert!(nodes_down.due(at(16)));
    }
}
