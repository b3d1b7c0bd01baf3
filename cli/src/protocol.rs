//! What `redlock run` and its supervisor (`supervisor.rs`) say to each
//! other. `run` sends [`Control`] lines on the control pipe; the supervisor
//! answers with the lines of a [`SupervisorReport`]. Deadlines are in
//! nanoseconds of the monotonic clock both read ([`monotonic_ns`]). A leaf:
//! `run` and the supervisor import it, and neither imports the other.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};

use crate::exit;

/// The monotonic clock (`CLOCK_MONOTONIC`), as `run` and the supervisor
/// both read it: the deadlines they exchange are in its nanoseconds.
pub fn monotonic_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        let ns = Duration::from(t).as_nanos();
        u64::try_from(ns).unwrap_or(u64::MAX)
    })
}

/// How long processes that got SIGKILL may take to be gone: what is left
/// of the command's tree after that survived it (uninterruptible sleep,
/// another user's process), and is named.
pub const KILL_GRACE: Duration = Duration::from_secs(1);

/// A line from `run` to the supervisor on the control pipe.
pub enum Control {
    /// The lock is valid until this monotonic instant (nanoseconds).
    Deadline(u64),
    /// The lock is lost, or --max-hold reached: stop the command.
    Stop,
    /// Pass this signal on to the command's group.
    Signal(i32),
    /// `run` leaves: the lock is lost while processes that SIGKILL did not
    /// end are left, and it named them. The supervisor leaves too.
    Quit,
}

impl Control {
    pub fn line(&self) -> String {
        match self {
            Control::Deadline(ns) => format!("deadline {ns}\n"),
            Control::Stop => "stop\n".to_string(),
            Control::Signal(signal) => format!("signal {signal}\n"),
            Control::Quit => "quit\n".to_string(),
        }
    }

    pub fn parse(line: &str) -> Option<Control> {
        let (word, value) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "deadline" => value.parse().ok().map(Control::Deadline),
            "stop" => Some(Control::Stop),
            "signal" => value.parse().ok().map(Control::Signal),
            "quit" => Some(Control::Quit),
            _ => None,
        }
    }
}

/// Why the supervisor sent the command's processes SIGTERM (the report's
/// `term` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// `run` said `stop`.
    Asked,
    /// The deadline was near and no later one came.
    Expiring,
    /// `run` died.
    ToolGone,
    /// The command ended and left processes running.
    Leftover,
}

impl Term {
    /// The word of the report's `term` line.
    pub fn word(self) -> &'static str {
        match self {
            Term::Asked => "asked",
            Term::Expiring => "expiring",
            Term::ToolGone => "tool-gone",
            Term::Leftover => "leftover",
        }
    }
}

/// Why the supervisor sent the command's processes SIGKILL (the report's
/// `kill` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// --kill-after passed since the SIGTERM.
    After,
    /// The lock's last deadline passed.
    Deadline,
}

impl Kill {
    /// The word of the report's `kill` line.
    pub fn word(self) -> &'static str {
        match self {
            Kill::After => "after",
            Kill::Deadline => "deadline",
        }
    }
}

/// What the supervisor reports, read by `run` line by line as it comes.
#[derive(Debug, Default)]
pub struct SupervisorReport {
    /// The command could not start: its exit code (126, 127; 76 if the
    /// lock was about to run out; 71) and why.
    pub cannot_run: Option<(u8, String)>,
    /// The command's process group, once it started: where the command's
    /// tree cannot be found (not Linux), what `run` stops if the
    /// supervisor dies.
    pub pgid: Option<nix::unistd::Pid>,
    pub term: Option<Term>,
    pub kill: Option<Kill>,
    /// How the command ended, once none of its processes is left.
    pub ended: Option<ExitStatus>,
}

impl SupervisorReport {
    /// Reads one line of the report.
    pub fn take(&mut self, line: &str) {
        let (word, value) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "cannot-run" => {
                let (code, why) = value.split_once(' ').unwrap_or((value, ""));
                self.cannot_run = Some((code.parse().unwrap_or(exit::CANNOT_RUN), why.into()));
            }
            "term" => {
                let all = [Term::Asked, Term::Expiring, Term::Leftover, Term::ToolGone];
                self.term = Some(
                    all.into_iter()
                        .find(|t| t.word() == value)
                        .unwrap_or(Term::ToolGone),
                );
            }
            "kill" => {
                let all = [Kill::After, Kill::Deadline];
                self.kill = Some(
                    all.into_iter()
                        .find(|k| k.word() == value)
                        .unwrap_or(Kill::Deadline),
                );
            }
            "ended" => self.ended = value.parse().ok().map(ExitStatus::from_raw),
            "pgid" => self.pgid = value.parse().ok().map(nix::unistd::Pid::from_raw),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_and_report_line_reads_back_as_written() {
        for control in [
            Control::Deadline(42),
            Control::Stop,
            Control::Signal(10),
            Control::Quit,
        ] {
            let line = control.line();
            let back = Control::parse(line.trim_end()).expect("parses");
            assert_eq!(back.line(), line);
        }
        for term in [Term::Asked, Term::Expiring, Term::ToolGone, Term::Leftover] {
            let mut report = SupervisorReport::default();
            report.take(&format!("term {}", term.word()));
            assert_eq!(report.term, Some(term));
        }
        for kill in [Kill::After, Kill::Deadline] {
            let mut report = SupervisorReport::default();
            report.take(&format!("kill {}", kill.word()));
            assert_eq!(report.kill, Some(kill));
        }
        let mut report = SupervisorReport::default();
        for line in ["pgid 7", "ended 256", "cannot-run 127 no such file"] {
            report.take(line);
        }
        assert_eq!(report.pgid, Some(nix::unistd::Pid::from_raw(7)));
        assert_eq!(report.ended.and_then(|s| s.code()), Some(1));
        assert_eq!(report.cannot_run, Some((127, "no such file".into())));
    }
}
