//! Waiting for a lock, through the library's cancellable wait.
//!
//! The first attempt is one round (`try_lock`, `try_acquire`): what it
//! finds is said at once, and `--no-wait` stops there. Then the library
//! waits (`lock`, `acquire` with a [`Patience::For`] and the [`Events`]'
//! [`Cancel`](redlock_sync::Cancel)). Its pauses end early when the holder
//! releases the lock, and at once on a stop signal.
//!
//! The library says nothing while it waits, yet too few nodes must be said
//! every [`SAY_NODES_EVERY`]. So the tool hands it the wait in slices of
//! that long (or of `--retry-delay`, if longer), and looks at each slice's
//! error in between. The last attempt is one round as `--wait` runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_sync::{
    LockError, LockOptions, NodeError, NodeOutcome, Patience, RedlockBuilder, Report,
};

use crate::args::Acquisition;
use crate::events::Events;
use crate::exit::{self, say, Failure};

/// How often, at most, a wait that keeps finding too few nodes says so
/// again (`redlock run --help` says 10 s). Said once only, a wait of hours
/// would look like a hang; said at every attempt, it would flood a log.
/// Also the longest slice of a wait handed to the library.
const SAY_NODES_EVERY: Duration = Duration::from_secs(10);

/// The signal reported for a wait cancelled with no signal in sight, which
/// cannot happen: the signal is sent before the cancellation.
const SIGTERM: i32 = 15;

/// How long to keep trying, how to pause, and how to report a conflict.
#[derive(Debug, Clone)]
pub struct WaitPlan {
    /// The last attempt starts at this; `None`: no limit.
    deadline: Option<Instant>,
    /// `--no-wait`: one attempt only.
    no_wait: bool,
    /// The fixed part of the pause (see [`paced`]).
    delay: Duration,
    /// The options of every attempt: the TTL, the kind and the owner.
    options: LockOptions,
    /// The owner label in `options`.
    owner: String,
    /// `-E`: the exit code for a lock held by another client, which is
    /// then not said unless `verbose`.
    conflict: Option<u8>,
    verbose: bool,
}

/// The library's pause between two attempts as `--retry-delay` asks: the
/// delay, plus up to half as much again at random (so waiters spread out).
pub fn paced(builder: RedlockBuilder, args: &Acquisition) -> RedlockBuilder {
    builder.retry_policy(
        redlock_sync::RetryPolicy::default()
            .delay(args.retry_delay)
            .jitter(args.retry_delay / 2),
    )
}

/// The owner label of the lock: `--owner`, else this host's name and the
/// pid of the process that holds the lock, `HOST:PID` (`unknown:PID`
/// where the name cannot be read).
fn owner(args: &Acquisition, holder: u32) -> String {
    if let Some(label) = &args.owner {
        return label.clone();
    }
    #[cfg(unix)]
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty());
    #[cfg(not(unix))]
    let host = std::env::var("COMPUTERNAME").ok();
    let host = host.unwrap_or_else(|| "unknown".to_string());
    format!("{host}:{holder}")
}

/// One call to the library: which form, with which options.
pub enum Form {
    /// One round (a `try_` form).
    Once(LockOptions),
    /// The waiting form (`lock`, `acquire`): its options carry the
    /// patience and the cancellation.
    Wait(LockOptions),
}

/// Which form the next call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// One round: the first attempt, and the last as `--wait` runs out.
    Once,
    /// A slice of the library's wait.
    Wait,
}

impl WaitPlan {
    /// The plan that the options of `args` ask for, counted from now.
    /// `holder` is the pid of the process that holds the lock, which the
    /// default owner label names.
    pub fn new(args: &Acquisition, holder: u32) -> WaitPlan {
        let owner = owner(args, holder);
        WaitPlan {
            deadline: args.wait.and_then(|wait| Instant::now().checked_add(wait)),
            no_wait: args.no_wait,
            delay: args.retry_delay,
            options: LockOptions::new(args.ttl)
                .kind(args.kind.kind())
                .owner(&owner),
            owner,
            conflict: args.conflict_exit_code,
            verbose: args.verbose,
        }
    }

    /// The owner label that each attempt stores with the lock.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The failure for a library error, with this wait's conflict code.
    /// A lock held by another client is said in one short line, in full
    /// with `-v`. With `-E` and without `-v` it is not said at all: cron
    /// mails whatever a job prints.
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

    /// The form of a call of `step` made at `now`.
    fn form(&self, step: Step, events: &Events, now: Instant) -> Form {
        if step == Step::Once {
            return Form::Once(self.options.clone());
        }
        let mut slice = SAY_NODES_EVERY.max(self.delay);
        if let Some(deadline) = self.deadline {
            slice = slice.min(deadline.saturating_duration_since(now));
        }
        Form::Wait(
            (self.options.clone())
                .patience(Patience::For(slice))
                .cancel(events.cancel()),
        )
    }
}

/// Tries to take the lock with `call` until it has it, fails for a reason
/// that waiting cannot mend, the wait runs out, or a stop signal arrives.
/// A stop signal ends it at once: it cancels the library's wait.
///
/// # Errors
///
/// The last attempt's error as a [`Failure`] with its code (conflict,
/// nodes, refused), or [`Failure::interrupted`].
pub fn keep_trying<T>(
    plan: &WaitPlan,
    events: &Events,
    resource: &str,
    mut call: impl FnMut(Form) -> Result<T, LockError>,
) -> Result<T, Failure> {
    let mut progress = Progress::new(resource);
    let mut step = Step::Once;
    loop {
        match call(plan.form(step, events, Instant::now())) {
            Ok(value) => return Ok(value),
            Err(e) => step = progress.after(plan, events, step, e)?,
        }
    }
}

/// What a wait has done so far, and what it has said.
struct Progress<'a> {
    resource: &'a str,
    started: Instant,
    /// The attempts of the whole wait; the library counts those of a call.
    attempts: u32,
    said_waiting: bool,
    nodes_down: NodesDown,
    /// The nodes already said to refuse this client.
    warned: Vec<Arc<str>>,
}

impl Progress<'_> {
    fn new(resource: &str) -> Progress<'_> {
        Progress {
            resource,
            started: Instant::now(),
            attempts: 0,
            said_waiting: false,
            nodes_down: NodesDown::default(),
            warned: Vec::new(),
        }
    }

    /// After a call of `step` failed with `e`: the next step, or the
    /// failure that ends the wait.
    fn after(
        &mut self,
        plan: &WaitPlan,
        events: &Events,
        step: Step,
        e: LockError,
    ) -> Result<Step, Failure> {
        let tried = attempts_in(&e);
        self.attempts = self.attempts.saturating_add(tried);
        if let LockError::Cancelled { .. } = e {
            let signal = events.pending_stop().unwrap_or(SIGTERM);
            let doing = format!("while waiting for `{}`", self.resource);
            return Err(Failure::interrupted(signal, &doing));
        }
        if let Some(report) = e.report() {
            refusals(report, &mut self.warned)?;
        }
        let too_few = matches!(e, LockError::NoQuorum { .. });
        if !too_few {
            self.nodes_down.mended();
        }
        if !waiting_may_mend(&e) || plan.no_wait {
            return Err(plan.failure(e));
        }
        let now = Instant::now();
        let next = match plan.deadline {
            Some(deadline) if now >= deadline => match step {
                Step::Once => return Err(self.gave_up(plan, e, tried)),
                // One last attempt as the wait runs out.
                Step::Wait => Step::Once,
            },
            _ => Step::Wait,
        };
        let why = recount(&e.to_string(), (tried, self.attempts));
        self.say_waiting(plan, &why, too_few, now);
        Ok(next)
    }

    /// Says that the wait goes on. Too few nodes is said even without
    /// `-v`: a wait without end must not look like a hang. The library's
    /// message names the failed nodes, never a password.
    fn say_waiting(&mut self, plan: &WaitPlan, why: &str, too_few: bool, now: Instant) {
        let resource = self.resource;
        if too_few && self.nodes_down.due(now) {
            if self.said_waiting {
                let waited = humantime::format_duration(round_secs(self.started.elapsed()));
                say(format_args!(
                    "still waiting for `{resource}` after {waited}: {why}"
                ));
            } else {
                say(format_args!("waiting for `{resource}`: {why}"));
            }
        } else if plan.verbose && !self.said_waiting {
            say(format_args!("waiting for `{resource}`: {why}"));
        } else {
            return;
        }
        self.said_waiting = true;
    }

    /// The failure of a wait that ran out: the last call's error (`tried`
    /// attempts), with how long the wait lasted and its attempts in all.
    fn gave_up(&self, plan: &WaitPlan, e: LockError, tried: u32) -> Failure {
        let waited = humantime::format_duration(round_ms(self.started.elapsed()));
        let mut failure = plan.failure(e);
        failure.message = recount(&failure.message, (tried, self.attempts));
        failure.context(format_args!(
            "gave up waiting for `{}` after {waited} and {} attempt(s)",
            self.resource, self.attempts
        ))
    }
}

/// How many attempts the library made in the call that failed with `e`.
fn attempts_in(e: &LockError) -> u32 {
    match e {
        LockError::Contended { attempts, .. } | LockError::NoQuorum { attempts, .. } => *attempts,
        _ => 1,
    }
}

/// Whether trying again may mend `e`: the lock held, too few nodes, a
/// round too slow.
fn waiting_may_mend(e: &LockError) -> bool {
    matches!(
        e,
        LockError::Contended { .. } | LockError::NoQuorum { .. } | LockError::TooSlow { .. }
    )
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

/// Nodes that refuse this client (a wrong or missing password, a missing
/// ACL permission) stay so however long it waits. If they leave too few
/// nodes for a quorum, that fails at once. Otherwise each is said once
/// (and added to `warned`), and the wait goes on with the others.
///
/// # Errors
///
/// The [`exit::REFUSED`] failure, naming each refusing node once and each
/// cause once (its hint says what to fix).
fn refusals(report: &Report, warned: &mut Vec<Arc<str>>) -> Result<(), Failure> {
    let refusing = refusing(report);
    if !refusing.is_empty() && report.nodes.len() - refusing.len() < report.quorum {
        return Err(Failure::new(
            exit::REFUSED,
            "refused",
            format!(
                "{} of {} nodes refuse this client (quorum {}): {}",
                refusing.len(),
                report.nodes.len(),
                report.quorum,
                by_cause(&refusing)
            ),
        ));
    }
    for (node, cause) in refusing {
        if !warned.contains(node) {
            say(format_args!(
                "node {node}: {cause}; going on with the other nodes"
            ));
            warned.push(node.clone());
        }
    }
    Ok(())
}

/// The refusing nodes, grouped by cause in their order: `a, b: cause`,
/// the groups joined by `; `.
fn by_cause(refusing: &[(&Arc<str>, String)]) -> String {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for (node, cause) in refusing {
        match groups.iter_mut().find(|(seen, _)| seen == cause) {
            Some((_, nodes)) => nodes.push(node),
            None => groups.push((cause, vec![node])),
        }
    }
    let groups: Vec<String> = groups
        .iter()
        .map(|(cause, nodes)| format!("{}: {cause}", nodes.join(", ")))
        .collect();
    groups.join("; ")
}

/// Says each node of `report` that refuses this client: the lock was had
/// without it, but it does not help the next time.
pub fn warn_refusals(report: &Report) {
    let _ = refusals(report, &mut Vec::new());
}

/// The nodes of `report` that cannot serve this client however long it
/// waits, each with its cause. These are the
/// library's `NodeError::is_permanent`: a refused password, a missing ACL
/// permission, a TLS failure, a host that does not exist. Not a lock held
/// as another kind: that is the flags' fault ([`Failure::from_lock`]).
fn refusing(report: &Report) -> Vec<(&Arc<str>, String)> {
    report
        .unusable()
        .filter_map(|n| match &n.outcome {
            NodeOutcome::Failed(NodeError::OtherKind(_)) => None,
            NodeOutcome::Failed(e) => Some((&n.node, e.to_string())),
            _ => None,
        })
        .collect()
}

/// When a wait says that too few nodes answered: at the first attempt of
/// a run of such attempts, then at most once per [`SAY_NODES_EVERY`].
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
