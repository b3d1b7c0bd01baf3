//! `redlock run`: take the lock, run the command under it, keep the lock
//! alive meanwhile, stop the command if the lock is lost, release it after.
//!
//! The command runs under a supervisor (`supervisor.rs`), which owns every
//! process the command starts (see `tree.rs`). `run` goes through named
//! phases ([`Runner::supervise`]): may it start, start the supervisor,
//! watch, conclude. Watching covers the lock's deadlines and loss, signals,
//! the supervisor's report, and what SIGKILL did not end.
//!
//! The lock is released only once none of the command's processes is left:
//! the supervisor exits only then. If the supervisor died, `run` stops them
//! itself, as it is a subreaper too. The one exception is a lock already
//! lost: then `run` names what SIGKILL did not end, and leaves it.

use std::ffi::OsString;
use std::io::{self, PipeReader, PipeWriter, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

#[cfg(not(target_os = "linux"))]
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
#[cfg(not(target_os = "linux"))]
use nix::sys::signal::killpg;
use nix::sys::signal::Signal;
#[cfg(not(target_os = "linux"))]
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use redlock_sync::{LockError, LockGuard};

use crate::args::RunArgs;
use crate::events::{Events, Happening, Role};
use crate::exit::{self, say, Failure};
use crate::nodes;
use crate::protocol::{monotonic_ns, Control, Kill, SupervisorReport, Term, KILL_GRACE};
use crate::tree;
use crate::wait::{keep_trying, paced, round_ms, warn_refusals, Form, WaitPlan};

/// Runs `redlock run`; returns the exit code.
pub fn run(args: &RunArgs) -> Result<u8, Failure> {
    let take = &args.acquisition;
    let locks = nodes::client(&args.nodes, |builder| {
        // The pause between attempts while waiting, and before the
        // watchdog retries a failed extension.
        let builder = paced(builder, take);
        match args.max_hold {
            Some(cap) => builder.max_hold(cap),
            None => builder,
        }
    })?;
    let events = Events::listen(Role::Tool)?;
    // The lock is held for as long as this process keeps its lease.
    let plan = WaitPlan::new(take, std::process::id());
    let runner = Runner {
        argv: args.argv(),
        warn: warning(take.ttl, args.max_hold, args.kill_after),
        resource: &args.resource,
        kill_after: args.kill_after,
        // How often the lock is looked at while the command runs: often
        // next to the TTL, rarely next to a scheduler tick.
        tick: (take.ttl / 100).clamp(Duration::from_millis(10), Duration::from_millis(100)),
        verbose: take.verbose,
    };
    let resource = args.resource.as_str();

    // The library's wait, which a signal cancels and a release wakes.
    let guard = keep_trying(&plan, &events, resource, |form| match form {
        Form::Once(options) => locks.try_lock(resource, options),
        Form::Wait(options) => locks.lock(resource, options),
    })?;
    let status = runner.supervise(&guard, &events);
    // Released before any message is printed: whatever happened, the lock
    // is not kept a moment longer than the command.
    let released = guard.unlock();
    if let Ok(report) = &released {
        // A node that refuses this client did not stop the run, but
        // will not help the next one: said at the end, as the lock's
        // report is not at hand earlier.
        warn_refusals(report);
    }
    let status = status?;
    match released {
        // The command ended by itself, but the lock was lost at some
        // moment while it ran, or was gone at the release.
        Err(e @ LockError::Lost { .. }) => Err(lost_at_the_end(resource, &e.to_string())),
        // A release that reached too few nodes leaves keys that expire
        // within the TTL: the command's run was still covered.
        _ => Ok(exit::status_code(status)),
    }
}

/// The command ran to its end, but the lock did not hold throughout.
fn lost_at_the_end(resource: &str, reason: &str) -> Failure {
    Failure::new(
        exit::LOST,
        "lost",
        format!(
            "the command ended, but the lock on `{resource}` did not hold throughout \
             (its work may have overlapped another holder's): {reason}"
        ),
    )
}

/// The command to run, and how to watch over it.
struct Runner<'a> {
    argv: Vec<OsString>,
    resource: &'a str,
    kill_after: Duration,
    /// The command gets SIGTERM this long before the lock runs out, if it
    /// was not extended by then (see [`warning`]).
    warn: Duration,
    tick: Duration,
    verbose: bool,
}

/// The lock was seen lost while the command ran.
struct Lapse {
    /// When, by the wall clock (for the message).
    at: SystemTime,
    /// How long after the command started.
    after: Duration,
    reason: String,
}

/// How long before the lock runs out (or reaches --max-hold) the command
/// gets SIGTERM, if the lock was not extended by then. SIGKILL follows
/// when the lock runs out, or at the cap. It is --kill-after, but at most a
/// sixth of the shorter of the TTL and --max-hold. The watchdog extends the
/// lock when a third is left, and SIGTERM must not race a healthy
/// extension; a short cap leaves the command most of it.
fn warning(ttl: Duration, max_hold: Option<Duration>, kill_after: Duration) -> Duration {
    kill_after.min(max_hold.map_or(ttl, |cap| cap.min(ttl)) / 6)
}

/// How often processes of the command that SIGKILL did not end are named
/// while the lock is kept for them.
const NOTICE_EVERY: Duration = Duration::from_secs(5);

/// Where the command's tree cannot be found (not Linux): how long `run`
/// waits for the command's group to be gone, once it got SIGKILL after the
/// supervisor ended abnormally.
#[cfg(not(target_os = "linux"))]
const GROUP_GONE: Duration = Duration::from_secs(5);

/// The deadline the supervisor goes by, in nanoseconds of the monotonic
/// clock: the lock's validity, or the --max-hold cap if that comes first.
/// The validity never reaches a cap shorter than the TTL.
fn deadline(guard: &LockGuard) -> u64 {
    let now = monotonic_ns();
    let valid = now.saturating_add(nanos(guard.validity()));
    guard.hold_deadline().map_or(valid, |hold| {
        valid.min(now.saturating_add(nanos(hold.saturating_duration_since(Instant::now()))))
    })
}

/// A duration in whole milliseconds, saturated, for the supervisor's
/// command line.
fn ms(d: Duration) -> String {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).to_string()
}

/// The supervisor, running: its process, our end of its control pipe,
/// and the last deadline it was told.
struct Supervisor {
    process: std::process::Child,
    control: PipeWriter,
    sent: u64,
}

impl Supervisor {
    fn tell(&mut self, control: &Control) {
        if let Control::Deadline(ns) = control {
            self.sent = *ns;
        }
        // Gone already: its report says why.
        let _ = self.control.write_all(control.line().as_bytes());
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.process.id()).unwrap_or(i32::MAX)
    }
}

/// What `run` learns while the supervisor watches over the command.
struct Vigil {
    started: Instant,
    /// The supervisor's report, line by line.
    report: SupervisorReport,
    lapse: Option<Lapse>,
    /// Seen no longer extended while still held: the hold cap, not a
    /// loss, will end it.
    capped: bool,
    /// When the supervisor said it sent SIGKILL (its `kill` line).
    killed: Option<Instant>,
    /// When what SIGKILL did not end is to be named next.
    notice: Option<Instant>,
}

impl Runner<'_> {
    /// Runs the command under the supervisor, and waits until none of its
    /// processes is left. The supervisor starts the command with the lock's
    /// token in its environment, and owns every process it starts. `run`
    /// keeps it told of the lock's validity, of a loss, and of stop
    /// signals. A loss is a [`Failure`] with the lock-lost code.
    fn supervise(&self, guard: &LockGuard, events: &Events) -> Result<ExitStatus, Failure> {
        self.may_start(guard, events)?;
        let mut supervisor = self.start(guard, events)?;
        let vigil = self.watch(guard, events, &mut supervisor)?;
        self.conclude(guard, events, supervisor, vigil)
    }

    /// Nothing starts after a stop signal, or once the lock is lost.
    fn may_start(&self, guard: &LockGuard, events: &Events) -> Result<(), Failure> {
        if let Some(signal) = events.pending_stop() {
            return Err(Failure::interrupted(signal, "before the command started"));
        }
        if !guard.is_held() {
            return Err(Failure::new(
                exit::LOST,
                "lost",
                format!(
                    "the lock on `{}` was lost before the command started; it did not run",
                    self.resource
                ),
            ));
        }
        Ok(())
    }

    /// Starts the supervisor with what it needs on its command line and in
    /// its environment (the command's); reads its report as events.
    fn start(&self, guard: &LockGuard, events: &Events) -> Result<Supervisor, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::system(format!("cannot find redlock's own binary: {e}")))?;
        let pipes = Pipes::new()?;
        let sent = deadline(guard);
        let mut command = std::process::Command::new(exe);
        command
            .arg("supervise")
            .args(["--control-fd", &pipes.control_fd.to_string()])
            .args(["--report-fd", &pipes.report_fd.to_string()])
            .args(["--parent", &std::process::id().to_string()])
            .args(["--deadline-ns", &sent.to_string()])
            .args(["--warn-ms", &ms(self.warn)])
            .args(["--kill-after-ms", &ms(self.kill_after)])
            .args(["--resource", self.resource]);
        if self.verbose {
            command.arg("--verbose");
        }
        command
            .arg("--")
            .args(&self.argv)
            .env("REDLOCK_RESOURCE", self.resource)
            .env("REDLOCK_TOKEN", guard.token().to_string());
        match guard.fencing_token() {
            Some(fencing) => command.env("REDLOCK_FENCING_TOKEN", fencing.to_string()),
            // An outer run's token must not pass for this lock's.
            None => command.env_remove("REDLOCK_FENCING_TOKEN"),
        };
        // A group of its own: what is sent to `run`'s group (SIGKILL from
        // a job runner, SIGSTOP) does not reach the supervisor, which then
        // ends the command as the lock is no longer kept.
        command.process_group(0);
        // The command's processes come to `run` if the supervisor dies, at
        // any moment: `run` stops them itself (see `end_tree`).
        #[cfg(target_os = "linux")]
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let process = command
            .spawn()
            .map_err(|e| Failure::system(format!("cannot start redlock's supervisor: {e}")))?;
        let (control, report) = pipes.ours();
        events.read_lines(report)?;
        // Told by the library the moment the lock is lost (on its notifier
        // thread): the command is stopped at once, not at the next tick.
        // The vigil sees the lapse too, and records it.
        if let Ok(mut on_loss) = control.try_clone() {
            guard.on_lost(move |_| drop(on_loss.write_all(Control::Stop.line().as_bytes())));
        }
        Ok(Supervisor {
            process,
            control,
            sent,
        })
    }

    /// Keeps the supervisor told of the lock and of signals, and reads its
    /// report, until the report ends (the supervisor has exited). Fails
    /// with the lock-lost code, at once, where the lock is lost while
    /// processes of the command outlive SIGKILL.
    fn watch(
        &self,
        guard: &LockGuard,
        events: &Events,
        supervisor: &mut Supervisor,
    ) -> Result<Vigil, Failure> {
        let mut vigil = Vigil {
            started: Instant::now(),
            report: SupervisorReport::default(),
            lapse: None,
            capped: false,
            killed: None,
            notice: None,
        };
        loop {
            self.look_at_lock(guard, &mut vigil, supervisor);
            self.survivors(&mut vigil, supervisor)?;
            match events.next(self.tick) {
                Some(Happening::Stop(signal)) => supervisor.tell(&Control::Signal(signal)),
                Some(Happening::Line(line)) => {
                    vigil.report.take(&line);
                    if vigil.report.kill.is_some() && vigil.killed.is_none() {
                        vigil.killed = Some(Instant::now());
                    }
                }
                Some(Happening::Closed) => return Ok(vigil),
                _ => {}
            }
        }
    }

    /// Sends the supervisor a later deadline once the lock was extended,
    /// or `stop` (and records the lapse) once it is no longer held.
    fn look_at_lock(&self, guard: &LockGuard, vigil: &mut Vigil, supervisor: &mut Supervisor) {
        if vigil.lapse.is_some() {
            return;
        }
        if guard.is_held() {
            vigil.capped = vigil.capped || guard.is_ending();
            let deadline = deadline(guard);
            if deadline > supervisor.sent.saturating_add(1_000_000) {
                supervisor.tell(&Control::Deadline(deadline));
            }
        } else {
            supervisor.tell(&Control::Stop);
            vigil.lapse = Some(self.lapse(guard, vigil));
        }
    }

    /// Once SIGKILL was sent and [`KILL_GRACE`] has passed, names what is
    /// left of the command every [`NOTICE_EVERY`]. Meanwhile the lock is
    /// kept for it, up to --max-hold. Once the lock is lost, fails, naming
    /// them, and tells the supervisor to leave them.
    fn survivors(&self, vigil: &mut Vigil, supervisor: &mut Supervisor) -> Result<(), Failure> {
        let Some(killed) = vigil.killed else {
            return Ok(());
        };
        let now = Instant::now();
        let waiting = vigil.lapse.is_none() && vigil.notice.is_some_and(|at| now < at);
        if now < killed + KILL_GRACE || waiting {
            return Ok(());
        }
        let left = tree::descendants_of(supervisor.pid());
        if left.is_empty() {
            return Ok(());
        }
        if let Some(lapse) = &vigil.lapse {
            supervisor.tell(&Control::Quit);
            return Err(self.lost_with_survivors(lapse, &left));
        }
        say(format_args!(
            "SIGKILL did not end {} of the command under `{}`: {}; the lock is kept (extended) \
             until {} gone",
            processes(left.len()),
            self.resource,
            tree::list(&left),
            if left.len() == 1 { "it is" } else { "they are" },
        ));
        vigil.notice = Some(now + NOTICE_EVERY);
        Ok(())
    }

    /// Once the supervisor has exited: how the command ended, or the
    /// failure that says why it did not run, was stopped, or was left
    /// without its supervisor.
    fn conclude(
        &self,
        guard: &LockGuard,
        events: &Events,
        mut supervisor: Supervisor,
        mut vigil: Vigil,
    ) -> Result<ExitStatus, Failure> {
        let waited = supervisor.process.wait();
        let report = &vigil.report;
        if let Some((code, why)) = &report.cannot_run {
            let kind = match *code {
                exit::NOT_FOUND => "not_found",
                exit::CANNOT_RUN => "cannot_run",
                exit::LOST => "lost",
                _ => "system",
            };
            return Err(Failure::new(*code, kind, why));
        }
        let Some(ended) = report.ended else {
            return Err(self.supervisor_died(guard, events, &vigil, &waited));
        };
        // The supervisor stopped the command itself: the lock was about to
        // run out unextended, or ran out (`run` was stopped meanwhile).
        let ran_out = matches!(report.term, Some(Term::Expiring | Term::ToolGone))
            || report.kill == Some(Kill::Deadline);
        let lapse = match vigil.lapse.take() {
            Some(lapse) => Some(lapse),
            None => ran_out.then(|| self.lapse(guard, &vigil)),
        };
        match lapse {
            Some(lapse) => Err(self.lost(&lapse, &vigil.report, ended)),
            None => {
                if report.term == Some(Term::Leftover) && self.verbose {
                    say("the command ended and left processes running: they got SIGTERM");
                }
                Ok(ended)
            }
        }
    }

    /// The lock is no longer held (or about to run out unextended): when,
    /// and why.
    fn lapse(&self, guard: &LockGuard, vigil: &Vigil) -> Lapse {
        Lapse {
            at: SystemTime::now(),
            after: vigil.started.elapsed(),
            reason: self.reason(guard, vigil.capped),
        }
    }

    /// The supervisor ended without saying how the command ended: killed,
    /// say, at any moment, also before it said the command's group. What
    /// is left of the command gets SIGKILL, and is gone before the lock is
    /// released. Or the lock is lost while some of it outlives SIGKILL.
    fn supervisor_died(
        &self,
        guard: &LockGuard,
        events: &Events,
        vigil: &Vigil,
        waited: &io::Result<ExitStatus>,
    ) -> Failure {
        let how = match waited {
            Ok(status) => status.to_string(),
            Err(e) => format!("cannot wait for it: {e}"),
        };
        let ended = match self.end_tree(guard, events, vigil.report.pgid) {
            Ok(ended) => ended,
            Err(left) => {
                return match &vigil.lapse {
                    Some(lapse) => self.lost_with_survivors(lapse, &left),
                    None => self.lost_with_survivors(&self.lapse(guard, vigil), &left),
                }
            }
        };
        Failure::system(format!(
            "redlock's supervisor of the command under `{}` ended abnormally ({how}): \
             {ended}; the lock is released",
            self.resource
        ))
    }

    /// Stops what is left of the command after its supervisor died: its
    /// processes came to `run`, their subreaper. Each gets SIGKILL, again
    /// until none is left, and is reaped. What outlives it is named every
    /// [`NOTICE_EVERY`] while the lock is kept, and returned once the lock
    /// is lost. Returns what was done.
    #[cfg(target_os = "linux")]
    fn end_tree(
        &self,
        guard: &LockGuard,
        events: &Events,
        _: Option<Pid>,
    ) -> Result<String, Vec<tree::Process>> {
        let start = Instant::now();
        let mut notice = start + KILL_GRACE;
        let mut killed = 0;
        loop {
            let found = tree::descendants();
            killed = killed.max(tree::signal(&found, Signal::SIGKILL));
            if !tree::reap(|_| {}) {
                return Ok(if killed == 0 {
                    "no process of the command was left".to_string()
                } else {
                    format!(
                        "the command's {} got SIGKILL and {} gone",
                        processes(killed),
                        if killed == 1 { "is" } else { "are" }
                    )
                });
            }
            let (now, lost) = (Instant::now(), !guard.is_held());
            if now >= start + KILL_GRACE && (lost || now >= notice) {
                let left = tree::descendants();
                if lost && !left.is_empty() {
                    return Err(left);
                }
                if !left.is_empty() {
                    say(format_args!(
                        "redlock's supervisor died, and SIGKILL did not end {}: {}; the lock on \
                         `{}` is kept (extended) until {} gone",
                        processes(left.len()),
                        tree::list(&left),
                        self.resource,
                        if left.len() == 1 { "it is" } else { "they are" },
                    ));
                    notice = now + NOTICE_EVERY;
                }
            }
            // Wakes when a child ends (SIGCHLD).
            let _ = events.next(self.tick);
        }
    }

    /// Elsewhere, what is left of the command's group.
    #[cfg(not(target_os = "linux"))]
    fn end_tree(
        &self,
        _: &LockGuard,
        _: &Events,
        pgid: Option<Pid>,
    ) -> Result<String, Vec<tree::Process>> {
        Ok(match pgid {
            None => "the command had not started".to_string(),
            Some(pgid) if end_group(pgid) => {
                format!("the command's process group {pgid} got SIGKILL and is gone")
            }
            Some(pgid) => format!(
                "the command's process group {pgid} got SIGKILL but was not gone after {}",
                humantime::format_duration(GROUP_GONE)
            ),
        })
    }

    /// Why the lock is no longer kept: the hold cap, a loss, or the lock
    /// not extended in time.
    fn reason(&self, guard: &LockGuard, capped: bool) -> String {
        if capped {
            return "it was held for --max-hold and not extended further".to_string();
        }
        match guard.check() {
            Err(e) => e.to_string(),
            Ok(()) => format!(
                "it was not extended in time, {} before it would run out",
                humantime::format_duration(round_ms(self.warn))
            ),
        }
    }

    /// The failure that reports a lapse, once the command has ended.
    fn lost(&self, lapse: &Lapse, report: &SupervisorReport, status: ExitStatus) -> Failure {
        let kill = match report.kill {
            Some(Kill::After) => format!(
                ", and SIGKILL {} later",
                humantime::format_duration(self.kill_after)
            ),
            Some(Kill::Deadline) => ", and SIGKILL as the lock ran out".to_string(),
            None => String::new(),
        };
        let term = if report.term.is_some() {
            "SIGTERM"
        } else {
            "no signal"
        };
        Failure::new(
            exit::LOST,
            "lost",
            format!(
                "the lock on `{}` was lost at {}, {} after the command started: {}; \
                 sent the command's processes {term}{kill}; the command ended with {status}",
                self.resource,
                humantime::format_rfc3339_millis(lapse.at),
                humantime::format_duration(round_ms(lapse.after)),
                lapse.reason,
            ),
        )
    }

    /// The failure that reports a lapse while processes of the command
    /// outlive SIGKILL.
    fn lost_with_survivors(&self, lapse: &Lapse, left: &[tree::Process]) -> Failure {
        Failure::new(
            exit::LOST,
            "lost",
            format!(
                "the lock on `{}` was lost at {}, {} after the command started: {}; \
                 the command's processes got SIGKILL, but {} still {}, and may overlap the \
                 next holder: {}",
                self.resource,
                humantime::format_rfc3339_millis(lapse.at),
                humantime::format_duration(round_ms(lapse.after)),
                lapse.reason,
                processes(left.len()),
                if left.len() == 1 { "runs" } else { "run" },
                tree::list(left),
            ),
        )
    }
}

/// "1 process", "3 processes".
fn processes(n: usize) -> String {
    if n == 1 {
        "1 process".to_string()
    } else {
        format!("{n} processes")
    }
}

/// Ends what is left of the command's group after its supervisor ended
/// without saying how the command ended: SIGKILL, then waits (bounded)
/// until no process is left in the group. Returns whether it is gone.
#[cfg(not(target_os = "linux"))]
fn end_group(pgid: Pid) -> bool {
    let _ = killpg(pgid, Signal::SIGKILL);
    let start = Instant::now();
    loop {
        while let Ok(status) = waitpid(Pid::from_raw(-pgid.as_raw()), Some(WaitPidFlag::WNOHANG)) {
            if status == WaitStatus::StillAlive {
                break;
            }
        }
        if killpg(pgid, None) == Err(Errno::ESRCH) {
            return true;
        }
        if start.elapsed() >= GROUP_GONE {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A duration in nanoseconds, saturated.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The two pipes between `run` and its supervisor. The supervisor's ends
/// stay open across exec: they are named on its command line. Ours do not.
/// So the supervisor sees the control pipe close when `run` dies, and the
/// report pipe ends when the supervisor does.
struct Pipes {
    control: PipeWriter,
    control_fd: i32,
    control_theirs: PipeReader,
    report: PipeReader,
    report_fd: i32,
    report_theirs: PipeWriter,
}

impl Pipes {
    fn new() -> Result<Pipes, Failure> {
        let fail = |e: io::Error| Failure::system(format!("cannot make a pipe: {e}"));
        let (control_theirs, control) = io::pipe().map_err(fail)?;
        let (report, report_theirs) = io::pipe().map_err(fail)?;
        for theirs in [control_theirs.as_fd(), report_theirs.as_fd()] {
            fcntl(theirs, FcntlArg::F_SETFD(FdFlag::empty()))
                .map_err(|e| fail(io::Error::from(e)))?;
        }
        Ok(Pipes {
            control_fd: control_theirs.as_raw_fd(),
            report_fd: report_theirs.as_raw_fd(),
            control,
            control_theirs,
            report,
            report_theirs,
        })
    }

    /// Our ends, once the supervisor has its own: the control pipe's
    /// writer and the report pipe's reader.
    fn ours(self) -> (PipeWriter, PipeReader) {
        drop(self.control_theirs);
        drop(self.report_theirs);
        (self.control, self.report)
    }
}
