//! The supervisor: the small process between `redlock run` and its
//! command, so that the command never outlives the lock, however the tool
//! ends.
//!
//! `run` re-executes its own binary as the hidden `redlock supervise`,
//! which starts the command in a process group of its own and owns it:
//!
//! ```text
//! redlock run ── pipe: deadlines, "stop", signals ──▶ redlock supervise ──▶ the command's group
//!             ◀── pipe: what it did, how it ended ──
//! ```
//!
//! - The supervisor runs in a process group of its own, apart from `run`'s:
//!   a signal to `run`'s group (a CI runner ending the job's group,
//!   `kill -STOP -PGID`, `timeout -s KILL`) does not reach it, so it is
//!   there to end the command when `run` is gone or stopped. The
//!   terminal's stop signals (TSTP, TTIN, TTOU) are caught, so that they
//!   never stop it; the command starts with their default action (a
//!   caught signal's is reset on exec, where a blocked or ignored one
//!   would pass on).
//! - It says the command's process group right after starting it (`pgid`
//!   line): if the supervisor ends without saying how the command ended,
//!   `run` kills that group and waits for it to be gone before it
//!   releases the lock.
//! - It starts nothing if `run` is already gone, or the deadline is not
//!   ahead by more than the SIGTERM margin (then it says `cannot-run`).
//! - `run` sends each new deadline (nanoseconds of the monotonic clock,
//!   which both processes read: the lock's validity, or the `--max-hold`
//!   cap if sooner), `stop` when the lock is lost, and the INT, TERM, HUP,
//!   QUIT, USR1 and USR2 it gets.
//! - The group gets SIGTERM on `stop`, when `run` dies (its end of the pipe
//!   closes; on Linux also the parent-death signal; elsewhere a poll of the
//!   parent pid), or a little before the last deadline received if no
//!   later one came (`run` stopped, or the lock not extended in time). It
//!   gets SIGKILL `--kill-after` later, and at the last deadline at the
//!   latest: also when `run` is stopped (SIGSTOP, a frozen cgroup) and
//!   sends nothing more.
//! - When the command ends, whatever it left in its group gets the same
//!   treatment: the lock is released once the supervisor has exited.
//! - It says what it did on the report pipe and exits as the command did
//!   (its code, or 128 + the signal).
//!
//! - Ctrl-Z (SIGTSTP) does not suspend the command: it is continued at
//!   once.
//!
//! Not covered: a process that leaves the group (`setsid`, a daemon); and
//! the supervisor and `run` both killed with SIGKILL (`run` alone, or the
//! supervisor alone, is covered).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgid, getppid, Pid};

use crate::args::SuperviseArgs;
use crate::events::{Event, Events};
use crate::exit::{self, say};
use crate::protocol::{monotonic_ns, Kill, Message, Term};

/// How often the parent pid is looked at (where no parent-death signal
/// says it at once), and the longest sleep of the supervisor.
const POLL: Duration = Duration::from_millis(100);

/// How long processes that got SIGKILL may take to be gone before the
/// supervisor stops waiting for them.
const KILL_GRACE: Duration = Duration::from_secs(1);

/// Runs `redlock supervise`; returns the exit code (the command's).
pub fn supervise(args: &SuperviseArgs) -> u8 {
    // Its own end of the report pipe first: without it, `run` could not
    // learn of the command, so none is started.
    let mut report = match open_inherited(args.report_fd, true) {
        Ok(file) => Reporter(file),
        Err(e) => {
            say(format_args!("supervise: cannot open the report pipe: {e}"));
            return exit::SYSTEM;
        }
    };
    let control = open_inherited(args.control_fd, false);
    let parent = Pid::from_raw(args.parent);
    #[cfg(target_os = "linux")]
    {
        // Told at once when `run` dies; orphans of the command come to us,
        // to be reaped (a zombie would keep its group alive).
        let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGUSR1);
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
    let events = match Events::listen_waking() {
        Ok(events) => events,
        Err(failure) => return report.cannot_run(exit::SYSTEM, &failure.message),
    };
    match control {
        Ok(control) => {
            if let Err(failure) = events.read_lines(control) {
                return report.cannot_run(exit::SYSTEM, &failure.message);
            }
        }
        Err(e) => {
            return report.cannot_run(exit::SYSTEM, &format!("cannot open the control pipe: {e}"))
        }
    }
    // After the parent-death signal is set: a parent gone before it was
    // is seen here.
    if getppid() != parent {
        return report.cannot_run(exit::SYSTEM, "redlock ended before the command started");
    }
    let left = Duration::from_nanos(args.deadline_ns.saturating_sub(monotonic_ns()));
    if left <= Duration::from_millis(args.warn_ms) {
        return report.cannot_run(
            exit::LOST,
            &format!(
                "the lock on `{}` was about to run out (or reach --max-hold) before the \
                 command could start; it did not run",
                args.resource
            ),
        );
    }
    let child = match spawn(&args.command) {
        Ok(child) => child,
        Err(e) => {
            let code = spawn_code(&e);
            let program = args.command[0].to_string_lossy();
            return report.cannot_run(
                code,
                &format!("cannot run `{program}` (the lock was released): {e}"),
            );
        }
    };
    let mut group = Group::new(&child, args);
    report.line(format_args!("pgid {}", group.pgid));
    if args.verbose {
        // From a background group: with TOSTOP, a caught SIGTTOU would
        // restart the write for ever.
        without_sigttou(|| {
            say(format_args!(
                "holding `{}`; the command runs as pid {} in a process group of its own",
                args.resource,
                child.id()
            ))
        });
    }
    let terminal = Terminal::take(group.pgid, parent);
    let status = group.watch(&events, parent, &mut report, &terminal);
    if let Some(terminal) = &terminal {
        terminal.give_back(group.pgid);
    }
    report.line(format_args!("ended {}", status.into_raw()));
    exit::status_code(status)
}

/// The report pipe.
struct Reporter(File);

impl Reporter {
    fn line(&mut self, line: std::fmt::Arguments) {
        // `run` gone: nobody to tell.
        let _ = writeln!(self.0, "{line}");
    }

    /// Reports that the command could not start; returns its exit code.
    fn cannot_run(&mut self, code: u8, why: &str) -> u8 {
        self.line(format_args!("cannot-run {code} {why}"));
        code
    }
}

/// Opens the pipe end that `run` left open as descriptor `fd`, as a file
/// of our own (closed on exec, so the command does not get it), and
/// closes `fd`. Opening `/dev/fd/N` gives the same pipe, without `unsafe`.
fn open_inherited(fd: i32, write: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(!write)
        .write(write)
        .open(format!("/dev/fd/{fd}"));
    let _ = nix::unistd::close(fd);
    file
}

/// Starts the command in a process group of its own, with the
/// supervisor's standard input, output and error (the tool's).
fn spawn(argv: &[OsString]) -> io::Result<Child> {
    std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .process_group(0)
        .spawn()
}

/// The exit code for a command that could not start: the shell's 127
/// for not found, 126 for anything else.
fn spawn_code(e: &io::Error) -> u8 {
    match e.kind() {
        io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::CANNOT_RUN,
    }
}

/// The command's process group, and what was done to it.
struct Group {
    /// The command's pid, which is the group's id.
    pgid: Pid,
    /// The lock is valid until this instant (the last deadline received).
    deadline: Option<Instant>,
    /// SIGTERM this long before the deadline, if no later one came.
    warn: Duration,
    kill_after: Duration,
    /// When SIGTERM was sent, and why.
    termed: Option<(Instant, Term)>,
    /// When SIGKILL was sent.
    killed: Option<Instant>,
    /// How the command (the group's leader) ended.
    status: Option<ExitStatus>,
}

impl Group {
    fn new(child: &Child, args: &SuperviseArgs) -> Group {
        let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let mut group = Group {
            pgid,
            deadline: None,
            warn: Duration::from_millis(args.warn_ms),
            kill_after: Duration::from_millis(args.kill_after_ms),
            termed: None,
            killed: None,
            status: None,
        };
        group.extend(args.deadline_ns);
        group
    }

    /// The lock is valid until `ns` of the monotonic clock.
    fn extend(&mut self, ns: u64) {
        let left = Duration::from_nanos(ns.saturating_sub(monotonic_ns()));
        let at = Instant::now().checked_add(left);
        if at > self.deadline || self.deadline.is_none() {
            self.deadline = at;
        }
    }

    fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }

    fn term(&mut self, why: Term, report: &mut Reporter) {
        if self.termed.is_none() {
            self.signal(Signal::SIGTERM);
            // A stopped command would not see it.
            self.signal(Signal::SIGCONT);
            self.termed = Some((Instant::now(), why));
            report.line(format_args!("term {}", why.word()));
        }
    }

    fn kill(&mut self, why: Kill, report: &mut Reporter) {
        if self.killed.is_none() {
            self.signal(Signal::SIGKILL);
            self.killed = Some(Instant::now());
            report.line(format_args!("kill {}", why.word()));
        }
    }

    /// Whether any process is left in the group.
    fn is_empty(&self) -> bool {
        killpg(self.pgid, None) == Err(Errno::ESRCH)
    }

    /// Reaps every child that has ended (orphans of the command too, on
    /// Linux), noting the command's status. A command stopped from the
    /// terminal (Ctrl-Z: SIGTSTP) is continued at once: a suspended job
    /// would hold the lock, and the terminal, for as long as it is
    /// forgotten (and `run` would wait on).
    fn reap(&mut self) {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
                Ok(WaitStatus::Stopped(_, Signal::SIGTSTP)) => self.signal(Signal::SIGCONT),
                Ok(WaitStatus::Exited(pid, code)) if pid == self.pgid => {
                    self.status = Some(ExitStatus::from_raw((code & 0xff) << 8));
                }
                Ok(WaitStatus::Signaled(pid, signal, core)) if pid == self.pgid => {
                    let raw = signal as i32 | if core { 0x80 } else { 0 };
                    self.status = Some(ExitStatus::from_raw(raw));
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Watches over the group until it is empty (or SIGKILL did what it
    /// could); returns how the command ended.
    fn watch(
        &mut self,
        events: &Events,
        parent: Pid,
        report: &mut Reporter,
        terminal: &Option<Terminal>,
    ) -> ExitStatus {
        let mut terminal_given_back = false;
        loop {
            self.reap();
            if let Some(status) = self.status {
                if !terminal_given_back {
                    if let Some(terminal) = terminal {
                        terminal.give_back(self.pgid);
                    }
                    terminal_given_back = true;
                }
                let gave_up = self.killed.is_some_and(|at| at.elapsed() >= KILL_GRACE);
                if self.is_empty() || gave_up {
                    return status;
                }
                self.term(Term::Leftover, report);
            }
            let now = Instant::now();
            let warn_at = self
                .deadline
                .map(|d| d.checked_sub(self.warn).unwrap_or(now));
            if warn_at.is_some_and(|at| now >= at) {
                self.term(Term::Expiring, report);
            }
            let kill_at = self
                .termed
                .and_then(|(at, _)| at.checked_add(self.kill_after));
            if self.deadline.is_some_and(|d| now >= d) {
                self.kill(Kill::Deadline, report);
            } else if kill_at.is_some_and(|at| now >= at) {
                self.kill(Kill::After, report);
            }
            // Also where the parent-death signal came too late (the parent
            // died before it was set) or does not exist (not Linux): our
            // parent is another process then.
            if getppid() != parent {
                self.term(Term::ToolGone, report);
            }
            let next = [
                warn_at.filter(|_| self.termed.is_none()),
                self.deadline.filter(|_| self.killed.is_none()),
                kill_at.filter(|_| self.killed.is_none()),
            ]
            .into_iter()
            .flatten()
            .map(|at| at.saturating_duration_since(now))
            .fold(POLL, Duration::min);
            match events.next(next) {
                Some(Event::Line(line)) => match Message::parse(&line) {
                    Some(Message::Deadline(ns)) => self.extend(ns),
                    Some(Message::Stop) => self.term(Term::Asked, report),
                    Some(Message::Signal(signal)) => {
                        if let Ok(signal) = Signal::try_from(signal) {
                            self.signal(signal);
                        }
                    }
                    None => {}
                },
                // `run` is gone: nobody keeps the lock alive any more.
                Some(Event::Closed) => self.term(Term::ToolGone, report),
                // INT, TERM and HUP sent to the supervisor itself: `run`
                // passes on what it gets; the supervisor ends the group
                // only when the lock is no longer kept.
                _ => {}
            }
        }
    }
}

/// The controlling terminal, when standard input is it and `run`'s group
/// is in its foreground: the command's group gets the foreground while it
/// runs, so that it can read the terminal and Ctrl-C reaches it. The
/// supervisor, in a background group of the same session, may move the
/// foreground with SIGTTOU blocked.
struct Terminal {
    /// The group that had the foreground: `run`'s.
    ours: Pid,
}

impl Terminal {
    fn take(command: Pid, parent: Pid) -> Option<Terminal> {
        let stdin = io::stdin();
        let ours = getpgid(Some(parent)).ok()?;
        if nix::unistd::tcgetpgrp(&stdin).ok()? != ours {
            return None;
        }
        without_sigttou(|| nix::unistd::tcsetpgrp(&stdin, command)).ok()?;
        // Had it read the terminal before it was given the foreground,
        // SIGTTIN stopped it.
        let _ = killpg(command, Signal::SIGCONT);
        Some(Terminal { ours })
    }

    /// Gives the foreground back to `run`'s group, if the command's group
    /// still has it (after `run` died, its shell may have taken it back).
    fn give_back(&self, command: Pid) {
        let stdin = io::stdin();
        if nix::unistd::tcgetpgrp(&stdin) == Ok(command) {
            let _ = without_sigttou(|| nix::unistd::tcsetpgrp(&stdin, self.ours));
        }
    }
}

/// Runs `f` with SIGTTOU blocked: a process that is not in the terminal's
/// foreground may change it only so.
fn without_sigttou<T>(f: impl FnOnce() -> T) -> T {
    let mut old = SigSet::empty();
    let blocked = pthread_sigmask(
        SigmaskHow::SIG_BLOCK,
        Some(&SigSet::from(Signal::SIGTTOU)),
        Some(&mut old),
    );
    let out = f();
    if blocked.is_ok() {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    out
}
