//! `redlock run`: take the lock, run the command under it, keep the lock
//! alive meanwhile, stop the command if the lock is lost, release it after.

use std::ffi::OsString;
use std::io::{self, PipeReader, PipeWriter, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use redlock_sync::{LockError, LockGuard};

use crate::args::RunArgs;
use crate::events::{Event, Events};
use crate::exit::{self, say, Failure};
use crate::nodes;
use crate::protocol::{monotonic_ns, Kill, Message, Report, Term};
use crate::wait::{keep_trying, paced, round_ms, warn_refusals, Form, Patience};

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
    let events = Events::listen()?;
    let patience = Patience::new(take);
    let command = Command {
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
    let guard = keep_trying(&patience, &events, resource, |form| match form {
        Form::Once(options) => locks.try_lock(resource, options),
        Form::Wait(options) => locks.lock(resource, options),
    })?;
    let status = command.supervise(&guard, &events);
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
struct Command<'a> {
    argv: Vec<OsString>,
    resource: &'a str,
    kill_after: Duration,
    /// The group gets SIGTERM this long before the lock runs out, if it
    /// was not extended by then (see [`warning`]).
    warn: Duration,
    tick: Duration,
    verbose: bool,
}

/// The lock was seen lost while the command ran.
struct Loss {
    /// When, by the wall clock (for the message).
    at: SystemTime,
    /// How long after the command started.
    after: Duration,
    reason: String,
}

/// How long before the lock runs out (or reaches --max-hold) the command
/// gets SIGTERM if the lock was not extended by then: --kill-after, but at
/// most a sixth of the TTL or of --max-hold, whichever is shorter (the
/// watchdog extends the lock when a third is left, and SIGTERM must not
/// race a healthy extension; a short cap leaves the command most of it).
/// SIGKILL follows when the lock runs out, or at the cap.
fn warning(ttl: Duration, max_hold: Option<Duration>, kill_after: Duration) -> Duration {
    kill_after.min(max_hold.map_or(ttl, |cap| cap.min(ttl)) / 6)
}

/// How long `run` waits, after the supervisor ended abnormally, for the
/// command's group to be gone once it got SIGKILL.
const GROUP_GONE: Duration = Duration::from_secs(5);

/// The deadline the supervisor goes by, in nanoseconds of the monotonic
/// clock: the lock's validity, or the --max-hold cap if that comes first
/// (a cap shorter than the TTL is never reached by the validity).
fn deadline(guard: &LockGuard) -> u64 {
    let now = monotonic_ns();
    let valid = now.saturating_add(nanos(guard.validity()));
    guard.hold_deadline().map_or(valid, |hold| {
        valid.min(now.saturating_add(nanos(hold.saturating_duration_since(Instant::now()))))
    })
}

/// Ends what is left of the command's group after its supervisor ended
/// without saying how the command ended: SIGKILL, then waits (bounded)
/// until no process is left in the group, reaping those that came to us
/// (`run` is their subreaper on Linux). Returns whether it is gone.
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

/// A duration in whole milliseconds, saturated, for the supervisor's
/// command line.
fn ms(d: Duration) -> String {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).to_string()
}

impl Command<'_> {
    /// Starts the supervisor (see `supervisor.rs`), which starts the
    /// command with the lock's token in its environment, in a process
    /// group of its own; keeps it told of the lock's validity, and of a
    /// loss (then the group gets SIGTERM, and SIGKILL `kill_after` later
    /// or when the lock runs out); passes stop signals on; waits for it to
    /// end. A loss is a [`Failure`] with the lock-lost code.
    fn supervise(&self, guard: &LockGuard, events: &Events) -> Result<ExitStatus, Failure> {
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
        let exe = std::env::current_exe()
            .map_err(|e| Failure::system(format!("cannot find redlock's own binary: {e}")))?;
        let pipes = Pipes::new()?;
        let mut sent = deadline(guard);
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
        // The command's processes come to `run` if the supervisor dies, so
        // that `run` can reap them (and see the group gone).
        #[cfg(target_os = "linux")]
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let mut supervisor = command
            .spawn()
            .map_err(|e| Failure::system(format!("cannot start redlock's supervisor: {e}")))?;
        let (mut control, report) = pipes.ours();
        // Told by the library the moment the lock is lost (on its notifier
        // thread): the command is stopped at once, not at the next tick.
        // The loop below sees the loss too, and records it.
        if let Ok(mut on_loss) = control.try_clone() {
            guard.on_lost(move |_| drop(on_loss.write_all(Message::Stop.line().as_bytes())));
        }
        let mut tell = |message: Message| {
            // Gone already: its report says why.
            let _ = control.write_all(message.line().as_bytes());
        };
        let started = Instant::now();
        let mut loss: Option<Loss> = None;
        // Seen no longer extended while still held: the hold cap, not a
        // loss, will end it.
        let mut capped = false;
        let waited = loop {
            match supervisor.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) => {}
                Err(e) => {
                    // Not killed: the supervisor ends the command's group
                    // as `stop` tells it, and then its report ends.
                    tell(Message::Stop);
                    break Err(e);
                }
            }
            if loss.is_none() {
                if guard.is_held() {
                    capped = capped || guard.is_ending();
                    let deadline = deadline(guard);
                    if deadline > sent.saturating_add(1_000_000) {
                        tell(Message::Deadline(deadline));
                        sent = deadline;
                    }
                } else {
                    tell(Message::Stop);
                    loss = Some(Loss {
                        at: SystemTime::now(),
                        after: started.elapsed(),
                        reason: self.reason(guard, capped),
                    });
                }
            }
            if let Some(Event::Stop(signal)) = events.next(self.tick) {
                tell(Message::Signal(signal));
            }
        };
        // Read to its end: the supervisor has exited (or, after a failed
        // wait, ends once the command's group is gone).
        let report = Report::parse(&std::io::read_to_string(report).unwrap_or_default());
        if let Some((code, why)) = report.cannot_run {
            let kind = match code {
                exit::NOT_FOUND => "not_found",
                exit::CANNOT_RUN => "cannot_run",
                exit::LOST => "lost",
                _ => "system",
            };
            return Err(Failure::new(code, kind, why));
        }
        if report.ended.is_none() {
            return Err(self.supervisor_died(&report, &waited));
        }
        let status = waited
            .map_err(|e| Failure::system(format!("cannot wait for redlock's supervisor: {e}")))?;
        // The supervisor's own status says the same, if its report was lost.
        let ended = report.ended.unwrap_or(status);
        // The supervisor stopped the command itself: the lock was about to
        // run out unextended, or ran out (`run` was stopped meanwhile).
        let ran_out = matches!(report.term, Some(Term::Expiring | Term::ToolGone))
            || report.kill == Some(Kill::Deadline);
        let loss = loss.or_else(|| {
            ran_out.then(|| Loss {
                at: SystemTime::now(),
                after: started.elapsed(),
                reason: self.reason(guard, capped),
            })
        });
        match loss {
            Some(loss) => Err(self.lost(&loss, &report, ended)),
            None => {
                if report.term == Some(Term::Leftover) && self.verbose {
                    say("the command ended and left processes in its group: they got SIGTERM");
                }
                Ok(ended)
            }
        }
    }

    /// The supervisor ended without saying how the command ended (killed,
    /// say): whatever is left of the command's group gets SIGKILL, and is
    /// gone before the lock is released.
    fn supervisor_died(&self, report: &Report, waited: &io::Result<ExitStatus>) -> Failure {
        let how = match waited {
            Ok(status) => status.to_string(),
            Err(e) => format!("cannot wait for it: {e}"),
        };
        let group = match report.pgid {
            None => "the command had not started".to_string(),
            Some(pgid) if end_group(pgid) => {
                format!("the command's process group {pgid} got SIGKILL and is gone")
            }
            Some(pgid) => format!(
                "the command's process group {pgid} got SIGKILL but was not gone after {}",
                humantime::format_duration(GROUP_GONE)
            ),
        };
        Failure::system(format!(
            "redlock's supervisor of the command under `{}` ended abnormally ({how}): \
             {group}; the lock is released",
            self.resource
        ))
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

    /// The failure that reports a loss, once the command has ended.
    fn lost(&self, loss: &Loss, report: &Report, status: ExitStatus) -> Failure {
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
                 sent the command's process group {term}{kill}; the command ended with {status}",
                self.resource,
                humantime::format_rfc3339_millis(loss.at),
                humantime::format_duration(round_ms(loss.after)),
                loss.reason,
            ),
        )
    }
}

/// A duration in nanoseconds, saturated.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The two pipes between `run` and its supervisor. The supervisor's ends
/// are left open across exec (they are named on its command line); ours
/// are not, so that the supervisor sees the control pipe close when `run`
/// dies, and the report pipe ends when the supervisor does.
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
