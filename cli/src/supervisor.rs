//! The supervisor: the small process between `redlock run` and its
//! command, so that the command never outlives the lock, however the tool
//! ends.
//!
//! `run` re-executes its own binary as the hidden `redlock supervise`. It
//! starts the command in a process group of its own, and owns it and every
//! process it starts. `protocol.rs` holds what the two say:
//!
//! ```text
//! redlock run ── pipe: deadlines, "stop", signals ──▶ redlock supervise ──▶ the command's tree
//!             ◀── pipe: what it did, how it ended ──
//! ```
//!
//! - The supervisor runs in a process group of its own, apart from `run`'s.
//!   A signal to `run`'s group does not reach it: a CI runner ending the
//!   job's group, `kill -STOP -PGID`, `timeout -s KILL`. So it is there to
//!   end the command when `run` is gone or stopped.
//! - The terminal's stop signals (TSTP, TTIN, TTOU) are caught, so that
//!   they never stop it. The command starts with their default action: a
//!   caught signal's is reset on exec, where a blocked or ignored one would
//!   pass on.
//! - On Linux it is a child subreaper: every process the command starts
//!   stays its descendant, also one that leaves the command's group
//!   (`timeout(1)`, `bash -m`, `setsid`, a double fork). What it stops is
//!   that tree (see `tree.rs`); elsewhere, the command's group.
//! - It starts nothing if `run` is already gone, or if the deadline is not
//!   ahead by more than the SIGTERM margin (then it says `cannot-run`).
//! - `run` sends each new deadline, `stop` when the lock is lost, and the
//!   INT, TERM, HUP, QUIT, USR1 and USR2 it gets, which go to the
//!   command's group. A deadline is the lock's validity, or the
//!   `--max-hold` cap if sooner, in nanoseconds of the monotonic clock.
//! - The tree gets SIGTERM on `stop`, when `run` dies, or a little before
//!   the last deadline received if no later one came. None comes when
//!   `run` is stopped, or the lock is not extended in time. `run`'s death
//!   shows as its end of the pipe closing, on Linux also as the
//!   parent-death signal, elsewhere by a poll of the parent pid.
//! - The tree gets SIGKILL `--kill-after` later, and at the last deadline
//!   at the latest. That holds also when `run` is stopped (SIGSTOP, a
//!   frozen cgroup) and sends nothing more. SIGKILL is sent again to
//!   whatever is found in the tree, until nothing is left.
//! - When the command ends, whatever it left running gets the same
//!   treatment. The supervisor exits, and `run` releases the lock, only
//!   once none is left.
//! - A process that SIGKILL does not end (uninterruptible sleep, another
//!   user's) keeps the supervisor, and so the lock, while `run` keeps the
//!   lock. `run` names it every few seconds; if the lock is lost, it says
//!   so and sends `quit`. If `run` is gone, the supervisor gives up once
//!   the last deadline has passed, and names what is left itself.
//! - It says what it did on the report pipe, and exits as the command did
//!   (its code, or 128 + the signal).
//! - Ctrl-Z (SIGTSTP) does not suspend the command: it is continued at
//!   once.
//!
//! Not covered: the supervisor and `run` both killed with SIGKILL. Either
//! one alone is covered, at any moment: `run` is a subreaper too, and
//! stops the tree itself.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::{getpgid, getppid, Pid};

use crate::args::SuperviseArgs;
use crate::events::{Events, Happening, Role};
use crate::exit::{self, say};
use crate::protocol::{monotonic_ns, Control, Kill, Term, KILL_GRACE};
use crate::tree;

/// How often the parent pid is looked at (where no parent-death signal
/// says it at once), and the longest sleep of the supervisor.
const POLL: Duration = Duration::from_millis(100);

/// How often the tree is looked at again for SIGKILL once what is left
/// of it outlived [`KILL_GRACE`] (before, at each wake-up).
const SWEEP_SLOWLY: Duration = Duration::from_secs(1);

/// Runs `redlock supervise`; returns the exit code (the command's).
pub fn supervise(args: &SuperviseArgs) -> u8 {
    // Its own end of the report pipe first: without it, `run` could not
    // learn of the command, so none is started.
    let mut report = match open_inherited(args.report_fd, PipeEnd::Write) {
        Ok(file) => Reporter(file),
        Err(e) => {
            say(format_args!("supervise: cannot open the report pipe: {e}"));
            return exit::SYSTEM;
        }
    };
    let parent = Pid::from_raw(args.parent);
    #[cfg(target_os = "linux")]
    {
        // Told at once when `run` dies; every process the command starts
        // stays our descendant (see `tree.rs`).
        let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGUSR1);
        let _ = nix::sys::prctl::set_child_subreaper(true);
    }
    let (events, child) = match start(args, parent) {
        Ok(started) => started,
        Err((code, why)) => return report.cannot_run(code, &why),
    };
    let mut job = Job::new(&child, args);
    // For `run`, where the command's tree cannot be found (not Linux).
    report.line(format_args!("pgid {}", job.leader));
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
    let terminal = Terminal::take(job.leader, parent);
    let status = job.watch(&events, parent, &mut report, terminal.as_ref());
    if let Some(terminal) = &terminal {
        terminal.give_back(job.leader);
    }
    match status {
        Some(status) => {
            report.line(format_args!("ended {}", status.into_raw()));
            exit::status_code(status)
        }
        // Gave up on what SIGKILL did not end; `run` is gone.
        None => exit::LOST,
    }
}

/// Listens to signals and to `run`'s messages, checks that the command may
/// start, and starts it; or says why not (an exit code and a message).
fn start(args: &SuperviseArgs, parent: Pid) -> Result<(Events, Child), (u8, String)> {
    let events = Events::listen(Role::Supervisor).map_err(|f| (exit::SYSTEM, f.message))?;
    let control = open_inherited(args.control_fd, PipeEnd::Read)
        .map_err(|e| (exit::SYSTEM, format!("cannot open the control pipe: {e}")))?;
    events
        .read_lines(control)
        .map_err(|f| (exit::SYSTEM, f.message))?;
    // After the parent-death signal is set: a parent gone before it was
    // is seen here.
    if getppid() != parent {
        return Err((
            exit::SYSTEM,
            "redlock ended before the command started".into(),
        ));
    }
    let left = Duration::from_nanos(args.deadline_ns.saturating_sub(monotonic_ns()));
    if left <= Duration::from_millis(args.warn_ms) {
        return Err((
            exit::LOST,
            format!(
                "the lock on `{}` was about to run out (or reach --max-hold) before the \
                 command could start; it did not run",
                args.resource
            ),
        ));
    }
    let child = spawn(&args.command).map_err(|e| {
        let program = args.command[0].to_string_lossy();
        (
            spawn_code(&e),
            format!("cannot run `{program}` (the lock was released): {e}"),
        )
    })?;
    Ok((events, child))
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

/// Which end of a pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PipeEnd {
    Read,
    Write,
}

/// Opens the pipe end that `run` left open as descriptor `fd`, as a file
/// of our own, and closes `fd`. The file is closed on exec, so the command
/// does not get it. Opening `/dev/fd/N` gives the same pipe, without
/// `unsafe`.
fn open_inherited(fd: i32, end: PipeEnd) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(end == PipeEnd::Read)
        .write(end == PipeEnd::Write)
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

/// The command, every process it started, and what was done to them.
struct Job {
    /// The command's pid, which is its group's id (while it is not
    /// reaped: a zombie keeps its pid).
    leader: Pid,
    resource: String,
    /// The lock is valid until this instant (the last deadline received).
    deadline: Option<Instant>,
    /// SIGTERM this long before the deadline, if no later one came.
    warn: Duration,
    kill_after: Duration,
    /// When SIGTERM was sent, and why.
    termed: Option<(Instant, Term)>,
    /// When SIGKILL was first sent, and when the tree was last looked at
    /// for it.
    killed: Option<(Instant, Instant)>,
    /// How the command (the group's leader) ended, once reaped.
    status: Option<ExitStatus>,
    /// `run` is gone: nobody keeps the lock alive any more.
    tool_gone: bool,
    /// `run` said `quit`: it has named what SIGKILL did not end.
    quit: bool,
}

impl Job {
    fn new(child: &Child, args: &SuperviseArgs) -> Job {
        let mut job = Job {
            leader: Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX)),
            resource: args.resource.clone(),
            deadline: None,
            warn: Duration::from_millis(args.warn_ms),
            kill_after: Duration::from_millis(args.kill_after_ms),
            termed: None,
            killed: None,
            status: None,
            tool_gone: false,
            quit: false,
        };
        job.extend(args.deadline_ns);
        job
    }

    /// The lock is valid until `ns` of the monotonic clock.
    fn extend(&mut self, ns: u64) {
        let left = Duration::from_nanos(ns.saturating_sub(monotonic_ns()));
        let at = Instant::now().checked_add(left);
        if at > self.deadline || self.deadline.is_none() {
            self.deadline = at;
        }
    }

    /// Whether signals go to the command's group: while its leader is not
    /// reaped (its id cannot be another group's then). Once it is, on
    /// Linux the tree is reached by [`tree::signal`]; elsewhere the group
    /// is all there is.
    fn by_group(&self) -> bool {
        self.status.is_none() || !cfg!(target_os = "linux")
    }

    fn to_group(&self, signal: Signal) {
        if self.by_group() {
            let _ = killpg(self.leader, signal);
        }
    }

    /// Passes on a signal that `run` got: to the command's group, as a
    /// shell's job gets it; once the command has ended, to what it left.
    fn pass_on(&self, signal: Signal) {
        self.to_group(signal);
        if !self.by_group() {
            tree::signal(&tree::descendants(), signal);
        }
    }

    /// Sends each of `signals` once to the group and to every other process
    /// of the tree, found before any is sent. Once only: a second SIGTERM
    /// may mean "now" to a process that handles the first.
    fn to_all(&self, signals: &[Signal]) {
        let by_group = self.by_group();
        let others: Vec<tree::Process> = tree::descendants()
            .into_iter()
            .filter(|p| !(by_group && p.in_group(self.leader.as_raw())))
            .collect();
        for &signal in signals {
            self.to_group(signal);
            tree::signal(&others, signal);
        }
    }

    fn term(&mut self, why: Term, report: &mut Reporter) {
        if self.termed.is_none() {
            // A stopped process would not see SIGTERM.
            self.to_all(&[Signal::SIGTERM, Signal::SIGCONT]);
            self.termed = Some((Instant::now(), why));
            report.line(format_args!("term {}", why.word()));
        }
    }

    fn kill(&mut self, why: Kill, report: &mut Reporter) {
        if self.killed.is_none() {
            self.to_all(&[Signal::SIGKILL]);
            let now = Instant::now();
            self.killed = Some((now, now));
            report.line(format_args!("kill {}", why.word()));
        }
    }

    /// Once SIGKILL was sent, sends it again to whatever the tree holds now:
    /// a process forked meanwhile, one re-parented to us, one that survived
    /// so far. At each wake-up for [`KILL_GRACE`], then every
    /// [`SWEEP_SLOWLY`].
    fn sweep(&mut self) {
        if let Some((first, last)) = self.killed {
            let now = Instant::now();
            if now < first + KILL_GRACE || now >= last + SWEEP_SLOWLY {
                self.to_all(&[Signal::SIGKILL]);
                self.killed = Some((first, now));
            }
        }
    }

    /// Reaps every child that has ended (the command, and on Linux every
    /// orphan of it), noting the command's status. Returns whether any
    /// process of the command is left. A process stopped from the terminal
    /// (Ctrl-Z) is continued at once: a suspended job would hold the lock
    /// and the terminal for as long as it is forgotten.
    fn reap(&mut self) -> bool {
        let (leader, mut status, mut stopped) = (self.leader, None, Vec::new());
        let children = tree::reap(|reaped| match reaped {
            WaitStatus::Stopped(pid, Signal::SIGTSTP) => stopped.push(pid),
            WaitStatus::Exited(pid, code) if pid == leader => {
                status = Some(ExitStatus::from_raw((code & 0xff) << 8));
            }
            WaitStatus::Signaled(pid, signal, core) if pid == leader => {
                status = Some(ExitStatus::from_raw(
                    signal as i32 | if core { 0x80 } else { 0 },
                ));
            }
            _ => {}
        });
        // Only stopped, not reaped: still our children.
        for pid in stopped {
            let _ = kill(pid, Signal::SIGCONT);
            self.to_group(Signal::SIGCONT);
        }
        self.status = self.status.or(status);
        // Elsewhere orphans are not ours to reap: the group tells.
        children || (!cfg!(target_os = "linux") && killpg(self.leader, None) != Err(Errno::ESRCH))
    }

    /// Watches over the command until none of its processes is left;
    /// returns how the command ended. `None`: `run` is gone, the lock's
    /// last deadline has passed, and SIGKILL did not end everything (what
    /// is left is named on standard error, unless `run` did so).
    fn watch(
        &mut self,
        events: &Events,
        parent: Pid,
        report: &mut Reporter,
        terminal: Option<&Terminal>,
    ) -> Option<ExitStatus> {
        let mut terminal = terminal;
        loop {
            let left = self.reap();
            if let Some(status) = self.status {
                // The terminal back to `run`'s group as soon as the
                // command is done, not once its leftovers are.
                if let Some(terminal) = terminal.take() {
                    terminal.give_back(self.leader);
                }
                if !left {
                    return Some(status);
                }
                self.term(Term::Leftover, report);
            }
            self.on_time(report);
            // Also where the parent-death signal came too late (the parent
            // died before it was set) or does not exist (not Linux): our
            // parent is another process then.
            if getppid() != parent {
                self.tool_gone = true;
                self.term(Term::ToolGone, report);
            }
            self.sweep();
            if self.gives_up() {
                if !self.quit {
                    without_sigttou(|| self.name_survivors());
                }
                return None;
            }
            let happening = events.next(self.next_wake());
            self.on_happening(happening, report);
        }
    }

    /// SIGTERM when the deadline is near, SIGKILL at it or --kill-after
    /// after SIGTERM.
    fn on_time(&mut self, report: &mut Reporter) {
        let now = Instant::now();
        if self.warn_at().is_some_and(|at| now >= at) {
            self.term(Term::Expiring, report);
        }
        if self.deadline.is_some_and(|d| now >= d) {
            self.kill(Kill::Deadline, report);
        } else if self.kill_at().is_some_and(|at| now >= at) {
            self.kill(Kill::After, report);
        }
    }

    fn warn_at(&self) -> Option<Instant> {
        self.deadline
            .map(|d| d.checked_sub(self.warn).unwrap_or_else(Instant::now))
    }

    fn kill_at(&self) -> Option<Instant> {
        self.termed
            .and_then(|(at, _)| at.checked_add(self.kill_after))
    }

    /// How long to wait for an event: until the next thing to do, at most
    /// [`POLL`].
    fn next_wake(&self) -> Duration {
        let now = Instant::now();
        [
            self.warn_at().filter(|_| self.termed.is_none()),
            self.deadline.filter(|_| self.killed.is_none()),
            self.kill_at().filter(|_| self.killed.is_none()),
        ]
        .into_iter()
        .flatten()
        .map(|at| at.saturating_duration_since(now))
        .fold(POLL, Duration::min)
    }

    fn on_happening(&mut self, happening: Option<Happening>, report: &mut Reporter) {
        match happening {
            Some(Happening::Line(line)) => match Control::parse(&line) {
                Some(Control::Deadline(ns)) => self.extend(ns),
                Some(Control::Stop) => self.term(Term::Asked, report),
                Some(Control::Signal(signal)) => {
                    if let Ok(signal) = Signal::try_from(signal) {
                        self.pass_on(signal);
                    }
                }
                Some(Control::Quit) => {
                    self.quit = true;
                    self.tool_gone = true;
                }
                None => {}
            },
            // `run` is gone: nobody keeps the lock alive any more.
            Some(Happening::Closed) => {
                self.tool_gone = true;
                self.term(Term::ToolGone, report);
            }
            // INT, TERM and HUP sent to the supervisor itself: `run`
            // passes on what it gets; the supervisor ends the command
            // only when the lock is no longer kept.
            _ => {}
        }
    }

    /// Whether to leave what SIGKILL did not end. Yes when `run` said
    /// `quit`: the lock is lost, and `run` said so. Yes when `run` is gone
    /// and the last deadline has passed: nobody keeps the lock. What is
    /// left got SIGKILL, which a process in uninterruptible sleep still
    /// gets when it wakes.
    fn gives_up(&self) -> bool {
        let now = Instant::now();
        let Some((killed, _)) = self.killed else {
            return false;
        };
        self.quit
            || (self.tool_gone
                && now >= killed + KILL_GRACE
                && self.deadline.is_none_or(|d| now >= d))
    }

    fn name_survivors(&self) {
        say(format_args!(
            "the lock on `{}` is no longer kept (redlock is gone, and the lock ran out): \
             SIGKILL did not end these processes of the command: {}",
            self.resource,
            tree::list(&tree::descendants())
        ));
    }
}

/// The controlling terminal, when standard input is it and `run`'s group
/// is in its foreground. The command's group gets the foreground while it
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
