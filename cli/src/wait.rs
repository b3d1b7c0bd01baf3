//! Waiting for a lock, through the library's cancellable wait.
//!
//! The first attempt is one round (`try_lock`, `try_acquire`), so that what
//! it finds (too few nodes, nodes that refuse this client, the lock held)
//! is said at once, and `--no-wait` stops there. Then the library waits
//! (`lock`, `acquire` with a [`LibPatience::For`] and the [`Events`]'
//! [`Cancel`](redlock_sync::Cancel), which a stop signal cancels): its
//! pauses end early when the holder releases the lock (wake-on-release),
//! and a signal ends them at once. The library says nothing while it waits,
//! and too few nodes must be said at most every [`SAY_NODES_EVERY`] during
//! a wait without end, so the tool hands it the wait in slices of that
//! long (or of `--retry-delay`, if longer), and looks at each slice's
//! error in between. The last attempt is one round as `--wait` runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_sync::{
    LockError, LockOptions, NodeOutcome, Patience as LibPatience, RedlockBuilder, Report,
};

use crate::args::Acquisition;
use crate::events::Events;
use crate::exit::{self, say, Failure};

/// How often, at most, a wait that keeps finding too few nodes says so
/// again: said once only, a wait that lasts hours would look like a hang;
/// said at every attempt, it would flood a log. (`redlock run --help` says
/// 10 s.) Also the longest slice of a wait handed to the library (unless
/// `--retry-delay` is longer).
const SAY_NODES_EVERY: Duration = Duration::from_secs(10);

/// The signal to report for a wait cancelled without a signal in sight
/// (cannot happen: the signal is sent before the cancellation): SIGTERM.
const SIGTERM: i32 = 15;

/// How long to keep trying, and how to pause between attempts.
#[derive(Debug, Clone)]
pub struct Patience {
    /// The last attempt starts at this; `None`: no limit.
    deadline: Option<Instant>,
    /// One attempt only.
    once: bool,
    /// The fixed part of the pause; up to half as much again is added at
    /// random (the library's retry policy, see [`paced`]).
    delay: Duration,
    /// The options of every attempt: the TTL and the kind.
    options: LockOptions,
    /// The exit code when the lock is held by another client, if given
    /// (`-E`): then that says nothing, unless `verbose`.
    conflict: Option<u8>,
    verbose: bool,
}

/// The library's pause between two attempts as `--retry-delay` asks: the
/// delay, plus up to half as much again at random (so waiters spread out).
pub fn paced(builder: RedlockBuilder, args: &Acquisition) -> RedlockBuilder {
    builder
        .retry_delay(args.retry_delay)
        .retry_jitter(args.retry_delay / 2)
}

/// One call to the library: which form, with which options.
pub enum Form {
    /// One round (a `try_` form).
    Once(LockOptions),
    /// The waiting form (`lock`, `acquire`): its options carry the
    /// patience and the cancellation.
    Wait(LockOptions),
}

impl Patience {
    /// The patience `--wait`, `--no-wait`, `--retry-delay`, `--ttl`,
    /// `--fenced` and `--conflict-exit-code` ask for, counted from now.
    pub fn new(args: &Acquisition) -> Patience {
        Patience {
            deadline: args.wait.and_then(|wait| Instant::now().checked_add(wait)),
            once: args.no_wait,
            delay: args.retry_delay,
            options: LockOptions::new(args.ttl).kind(args.kind()),
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

    /// The next call's form at `now`: one round first and last, the
    /// library's wait for a slice in between.
    fn form(&self, events: &Events, once: bool, now: Instant) -> Form {
        if once {
            return Form::Once(self.options.clone());
        }
        let mut slice = SAY_NODES_EVERY.max(self.delay);
        if let Some(deadline) = self.deadline {
            slice = slice.min(deadline.saturating_duration_since(now));
        }
        Form::Wait(
            (self.options.clone())
                .patience(LibPatience::For(slice))
                .cancel(events.cancel()),
        )
    }
}

/// Tries to take the lock with `call` until it has it, fails for a reason
/// that waiting cannot mend, the wait runs out, or a stop signal arrives
/// (then at once: it cancels the library's wait).
///
/// # Errors
///
/// The last attempt's error as a [`Failure`] (held by another: the
/// conflict code; too few nodes: the nodes code; nodes that refuse this
/// client: the refused code), or [`Failure::interrupted`].
pub fn keep_trying<T>(
    patience: &Patience,
    events: &Events,
    resource: &str,
    mut call: impl FnMut(Form) -> Result<T, LockError>,
) -> Result<T, Failure> {
    let started = Instant::now();
    let mut said_waiting = false;
    let mut nodes_down = NodesDown::default();
    let mut warned: Vec<Arc<str>> = Vec::new();
    let mut attempts = 0u32;
    let mut once = true;
    loop {
        let e = match call(patience.form(events, once, Instant::now())) {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        let (tried, retryable) = match &e {
            LockError::Contended { attempts, .. } | LockError::NoQuorum { attempts, .. } => {
                (*attempts, true)
            }
            LockError::TooSlow { .. } => (1, true),
            _ => (1, false),
        };
        attempts = attempts.saturating_add(tried);
        if let LockError::Cancelled { .. } = e {
            let signal = events.pending_stop().unwrap_or(SIGTERM);
            return Err(Failure::interrupted(
                signal,
                &format!("while waiting for `{resource}`"),
            ));
        }
        if let Some(report) = e.report() {
            refusals(report, &mut warned)?;
        }
        let too_few = matches!(e, LockError::NoQuorum { .. });
        if !too_few {
            nodes_down.mended();
        }
        if !retryable || patience.once {
            return Err(patience.failure(e));
        }
        let now = Instant::now();
        if patience.deadline.is_some_and(|deadline| now >= deadline) {
            if once {
                return Err(gave_up(patience, e, resource, started, (tried, attempts)));
            }
            // One last attempt as the wait runs out.
            once = true;
        } else {
            once = false;
        }
        // Too few nodes is said even without --verbose: without a limit
        // the wait lasts until they come back, and it must not look like
        // a hang. The library's message names the failed nodes, never a
        // password.
        let e = recount(&e.to_string(), (tried, attempts));
        if too_few && nodes_down.due(now) {
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
    }
}

/// `said` (a library error's message) with the attempts of the whole wait
/// (`attempts`) where the library counts those of its last call (`tried`).
fn recount(said: &str, (tried, attempts): (u32, u32)) -> String {
    said.replacen(
        &format!("after {tried} attempt(s)"),
        &format!("after {attempts} attempt(s)"),
        1,
    )
}

/// The failure of a wait that ran out: the last call's error, with how
/// long the wait lasted and how many attempts it made in all (`tried`:
/// the last call's, `attempts`: the whole wait's).
fn gave_up(
    patience: &Patience,
    e: LockError,
    resource: &str,
    started: Instant,
    (tried, attempts): (u32, u32),
) -> Failure {
    let waited = humantime::format_duration(round_ms(started.elapsed()));
    let mut failure = patience.failure(e);
    failure.message = recount(&failure.message, (tried, attempts));
    failure.context(format_args!(
        "gave up waiting for `{resource}` after {waited} and {attempts} attempt(s)"
    ))
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

    #[test]
    fn a_message_counts_the_attempts_of_the_whole_wait_not_of_the_last_call() {
        let said = "`r` is held by another client: not granted after 2 attempt(s); last round: ...";
        assert_eq!(
            recount(said, (2, 9)),
            "`r` is held by another client: not granted after 9 attempt(s); last round: ..."
        );
    }
}
