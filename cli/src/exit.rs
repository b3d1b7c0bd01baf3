//! The tool's exit codes, and the failures that end it: what they print
//! and which code they exit with. A failure prints one line on standard
//! error, and with `--json` one object on standard output.
//!
//! The codes follow `sysexits.h` where one fits, and the shell for a
//! command that cannot run or died of a signal. So scripts can tell
//! "someone else holds it" from "the nodes are down" from "a typo".

use std::fmt::Display;
use std::io::{self, Write};
use std::process::ExitStatus;
use std::time::Duration;

use redlock_sync::{LockError, NodeError, NodeOutcome, Report};
use serde_json::{json, Value};

/// Bad usage: an option, a duration, a URL, a token, no nodes; or a lock
/// held as another kind than the flags say (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// Too few nodes answered to decide (`EX_UNAVAILABLE`).
pub const NODES: u8 = 69;
/// The token could not be handed over: standard output is closed, a
/// broken pipe, or full (`EX_IOERR`); `acquire` released the lock.
pub const OUTPUT: u8 = 74;
/// The operating system failed us: threads, randomness, signals
/// (`EX_OSERR`).
pub const SYSTEM: u8 = 71;
/// Too many nodes refuse this client for a quorum: a wrong or missing
/// password, a missing ACL permission, a TLS failure, a host that does
/// not exist (`EX_NOPERM`). Waiting cannot fix it.
pub const REFUSED: u8 = 77;
/// The lock is held by another client (`EX_TEMPFAIL`: try again later);
/// the default of `--conflict-exit-code`.
pub const CONFLICT: u8 = 75;
/// The lock was lost while held, or was not held at extend or release.
pub const LOST: u8 = 76;
/// The command was found but could not be run (the shell's 126).
#[cfg_attr(not(unix), allow(dead_code))] // only `run` uses it
pub const CANNOT_RUN: u8 = 126;
/// The command was not found (the shell's 127).
#[cfg_attr(not(unix), allow(dead_code))] // only `run` uses it
pub const NOT_FOUND: u8 = 127;

/// What ends the tool unsuccessfully.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// A stable name for scripts (`--json`'s `error`).
    pub kind: &'static str,
    /// One line for people.
    pub message: String,
    /// What each node answered, when nodes were asked.
    pub report: Option<Report>,
    /// Nothing on standard error (a conflict with `-E` and without `-v`).
    pub quiet: bool,
}

impl Failure {
    pub fn new(code: u8, kind: &'static str, message: impl Display) -> Failure {
        Failure {
            code,
            kind,
            message: message.to_string(),
            report: None,
            quiet: false,
        }
    }

    pub fn usage(message: impl Display) -> Failure {
        Failure::new(USAGE, "usage", message)
    }

    pub fn system(message: impl Display) -> Failure {
        Failure::new(SYSTEM, "system", message)
    }

    /// Signal `signal` stopped the tool before it held the lock (or before
    /// the command started): exits as a shell reports a death by it.
    pub fn interrupted(signal: i32, while_doing: &str) -> Failure {
        let code = signal_code(signal);
        Failure::new(
            code,
            "interrupted",
            format!("stopped by signal {signal} {while_doing}; no lock is held"),
        )
    }

    /// The failure for a library error. `conflict` is the code for a lock
    /// held by another client.
    pub fn from_lock(e: LockError, conflict: u8) -> Failure {
        if let Some(failure) = wrong_kind(&e) {
            return failure;
        }
        let (code, kind) = match &e {
            LockError::Config(_) | LockError::Argument(_) => (USAGE, "usage"),
            LockError::Contended { .. } => (conflict, "conflict"),
            LockError::NoQuorum { .. } => (NODES, "no_quorum"),
            // Nodes that cannot serve this client (a wrong password, a
            // missing ACL permission, TLS, an unknown host): waiting
            // cannot fix it.
            LockError::Unusable { .. } => (REFUSED, "refused"),
            LockError::TooSlow { .. } => (NODES, "too_slow"),
            LockError::Lost { .. } => (LOST, "lost"),
            _ => (SYSTEM, "system"),
        };
        Failure {
            code,
            kind,
            report: e.report().cloned(),
            message: e.to_string(),
            quiet: false,
        }
    }

    /// The same failure, its message prefixed with what was being done.
    pub fn context(mut self, doing: impl Display) -> Failure {
        self.message = format!("{doing}: {}", self.message);
        self
    }

    /// The same failure, with what came of it after its message.
    pub fn then(mut self, outcome: impl Display) -> Failure {
        self.message = format!("{}; {outcome}", self.message);
        self
    }

    /// Prints the failure: a line on standard error, and with `json` an
    /// object on standard output.
    pub fn print(&self, json: bool) {
        if !self.quiet {
            say(format_args!("{}", self.message));
        }
        if json {
            let mut out = json!({
                "error": self.kind,
                "message": self.message,
                "exit_code": self.code,
            });
            if let Some(report) = &self.report {
                out["nodes"] = nodes_json(report);
            }
            let _ = print_line(format_args!("{out}"));
        }
    }
}

/// The usage failure for a lock held as another kind than the one given
/// (a node's [`NodeError::OtherKind`]): the flags are wrong, and waiting
/// cannot fix it. `None` for any other error.
fn wrong_kind(e: &LockError) -> Option<Failure> {
    let LockError::Unusable {
        resource, report, ..
    } = e
    else {
        return None;
    };
    let held_as = report.nodes.iter().find_map(|n| match &n.outcome {
        NodeOutcome::Failed(NodeError::OtherKind(what)) => Some(what),
        _ => None,
    })?;
    let message = format!(
        "`{resource}` is held as {held_as}, another kind than the one given: give the kind it was \
         taken with (--shared, --semaphore K with the same K, or neither for an exclusive lock)"
    );
    Some(Failure {
        report: Some(report.clone()),
        ..Failure::new(USAGE, "wrong_kind", message)
    })
}

/// Says `message` on standard error, after `redlock: `. A standard error
/// that cannot be written to (a closed pipe) is no reason to panic, nor to
/// fail: the message is lost.
pub fn say(message: impl Display) {
    let _ = writeln!(io::stderr().lock(), "redlock: {message}");
}

/// Writes `line` and a newline on standard output, and flushes it. Unlike
/// `println!`, never panics: a broken pipe or a full disk is an error for
/// the caller to handle (see [`Failure::output`]).
pub fn print_line(line: impl Display) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()
}

/// Writes `bytes` to standard output, flushed; a failure is the output
/// code's.
pub fn write_out(bytes: &[u8], what: &str) -> Result<u8, Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::output(&e, what))?;
    Ok(0)
}

impl Failure {
    /// Standard output could not be written: `e` says why.
    pub fn output(e: &io::Error, what: &str) -> Failure {
        Failure::new(
            OUTPUT,
            "output",
            format!("cannot write {what} to standard output: {e}"),
        )
    }
}

impl From<LockError> for Failure {
    /// A lock held by another client gets the default conflict code.
    fn from(e: LockError) -> Failure {
        Failure::from_lock(e, CONFLICT)
    }
}

/// The exit code for signal `signal`: 128 + its number, the shell's
/// convention.
pub fn signal_code(signal: i32) -> u8 {
    u8::try_from(signal)
        .ok()
        .and_then(|s| s.checked_add(128))
        .unwrap_or(SYSTEM)
}

/// The exit code that reports a child's status: its own code, or 128 + the
/// signal that killed it.
#[cfg_attr(not(unix), allow(dead_code))] // only `run` uses it
pub fn status_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        // A Unix exit status is one byte; other systems' wider codes are
        // truncated as a shell would.
        return code as u8;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return signal_code(signal);
        }
    }
    SYSTEM
}

/// What each node answered, for `--json`.
pub fn nodes_json(report: &Report) -> Value {
    report
        .nodes
        .iter()
        .map(|n| {
            let (outcome, error) = match &n.outcome {
                NodeOutcome::Granted => ("granted", None),
                NodeOutcome::Refused => ("refused", None),
                NodeOutcome::TimedOut => ("timed_out", None),
                NodeOutcome::Failed(e) => ("failed", Some(e.to_string())),
                NodeOutcome::NotAwaited => ("not_awaited", None),
                other => ("other", Some(other.to_string())),
            };
            let mut node = json!({
                "node": &*n.node,
                "outcome": outcome,
                "elapsed_ms": millis(n.elapsed),
            });
            if let Some(error) = error {
                node["error"] = error.into();
            }
            node
        })
        .collect()
}

/// A duration in milliseconds, with microseconds as the fraction.
pub fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_death_is_128_plus_the_signal() {
        assert_eq!(signal_code(15), 143);
        assert_eq!(signal_code(9), 137);
        assert_eq!(signal_code(-1), SYSTEM);
    }

    /// The errors of a round (`Contended` and the rest) come only from
    /// real nodes: tests/run.rs checks their codes, `--conflict-exit-code`
    /// too.
    #[test]
    fn library_errors_map_to_their_documented_codes() {
        let usage = Failure::from(LockError::from(redlock_sync::ConfigError::NoNodes));
        assert_eq!((usage.code, usage.kind), (USAGE, "usage"));
    }
}
