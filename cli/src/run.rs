//! `redlock run`: take the lock, run the command under it, keep the lock
//! alive meanwhile, stop the command if the lock is lost, release it after.

use std::ffi::{OsStr, OsString};
use std::io;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use redlock_sync::{LockError, LockGuard, LockOptions};

use crate::args::RunArgs;
use crate::events::{Event, Events};
use crate::exit::{self, Failure};
use crate::nodes;
use crate::wait::{keep_trying, round_ms, Patience};

/// Runs `redlock run`; returns the exit code.
pub fn run(args: &RunArgs) -> Result<u8, Failure> {
    let take = &args.acquisition;
    let locks = nodes::client(&args.nodes, |builder| {
        // The watchdog retries a failed extension after a pause like the
        // tool's between attempts.
        let builder = builder
            .retry_delay(take.retry_delay)
            .retry_jitter(take.retry_delay / 2);
        match args.max_hold {
            Some(cap) => builder.max_hold(cap),
            None => builder,
        }
    })?;
    let events = Events::listen()?;
    let patience = Patience::new(take);
    let command = Command {
        argv: &args.command,
        resource: &args.resource,
        kill_after: args.kill_after,
        // How often the lock is looked at while the command runs: often
        // next to the TTL, rarely next to a scheduler tick.
        tick: (take.ttl / 100).clamp(Duration::from_millis(10), Duration::from_millis(100)),
        verbose: take.verbose,
    };
    let resource = args.resource.as_str();

    // One round per attempt (`try_`): the tool waits between attempts
    // itself, where a signal can cut the wait short.
    let guard = keep_trying(&patience, &events, resource, || {
        let options = LockOptions::new(take.ttl).kind(crate::explicit::kind(take.fenced));
        locks.try_lock(resource, options).into()
    })?;
    let status = command.supervise(&guard, &events);
    // Released before any message is printed: whatever happened, the lock
    // is not kept a moment longer than the command.
    let released = guard.unlock();
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
    argv: &'a [OsString],
    resource: &'a str,
    kill_after: Duration,
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
    /// When the command gets SIGKILL, if it has not ended by then; `None`:
    /// never (a --kill-after too long for an `Instant` to hold).
    kill_at: Option<Instant>,
    killed: bool,
}

impl Command<'_> {
    /// Starts the command with the lock's token in its environment, passes
    /// stop signals on to it, and waits for it to end. If `guard`'s lock is
    /// lost meanwhile (the watchdog keeps it alive until then), the command
    /// gets SIGTERM, and SIGKILL `kill_after` later; that is a [`Failure`]
    /// with the lock-lost code.
    fn supervise(&self, guard: &LockGuard, events: &Events) -> Result<ExitStatus, Failure> {
        if let Some(signal) = events.pending_stop() {
            return Err(Failure::interrupted(signal, "before the command started"));
        }
        let program = &self.argv[0];
        let mut command = std::process::Command::new(program);
        command
            .args(&self.argv[1..])
            .env("REDLOCK_RESOURCE", self.resource)
            .env("REDLOCK_TOKEN", guard.token().to_string());
        match guard.fencing_token() {
            Some(fencing) => command.env("REDLOCK_FENCING_TOKEN", fencing.to_string()),
            // An outer run's token must not pass for this lock's.
            None => command.env_remove("REDLOCK_FENCING_TOKEN"),
        };
        let mut child = command.spawn().map_err(|e| spawn_failure(program, &e))?;
        if self.verbose {
            eprintln!(
                "redlock: holding `{}`; the command runs as pid {}",
                self.resource,
                child.id()
            );
        }
        let started = Instant::now();
        let mut loss: Option<Loss> = None;
        // Seen no longer extended while still held: the hold cap, not a
        // loss, will end it.
        let mut capped = false;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    return match loss {
                        None => Ok(status),
                        Some(loss) => Err(self.lost(&loss, child.id(), status)),
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Failure::system(format!("cannot wait for the command: {e}")));
                }
            }
            let now = Instant::now();
            match &mut loss {
                None if guard.is_held() => capped = capped || guard.is_ending(),
                None => {
                    send(&child, Signal::SIGTERM);
                    loss = Some(Loss {
                        at: SystemTime::now(),
                        after: now - started,
                        reason: if capped {
                            "it was held for --max-hold and not extended further".to_string()
                        } else {
                            // Not held: `check` says why.
                            guard
                                .check()
                                .err()
                                .map(|e| e.to_string())
                                .unwrap_or_default()
                        },
                        kill_at: now.checked_add(self.kill_after),
                        killed: false,
                    });
                }
                Some(loss) if !loss.killed && loss.kill_at.is_some_and(|at| now >= at) => {
                    send(&child, Signal::SIGKILL);
                    loss.killed = true;
                }
                _ => {}
            }
            let wait = match &loss {
                Some(Loss {
                    kill_at: Some(at),
                    killed: false,
                    ..
                }) => self.tick.min(at.saturating_duration_since(now)),
                _ => self.tick,
            };
            if let Some(Event::Stop(signal)) = events.next(wait) {
                if let Ok(signal) = Signal::try_from(signal) {
                    send(&child, signal);
                }
            }
        }
    }

    /// The failure that reports a loss, once the command has ended.
    fn lost(&self, loss: &Loss, pid: u32, status: ExitStatus) -> Failure {
        let kill = if loss.killed {
            format!(
                ", and SIGKILL {} later",
                humantime::format_duration(self.kill_after)
            )
        } else {
            String::new()
        };
        Failure::new(
            exit::LOST,
            "lost",
            format!(
                "the lock on `{}` was lost at {}, {} after the command started: {}; \
                 sent the command (pid {pid}) SIGTERM{kill}; it ended with {status}",
                self.resource,
                humantime::format_rfc3339_millis(loss.at),
                humantime::format_duration(round_ms(loss.after)),
                loss.reason,
            ),
        )
    }
}

/// Sends `signal` to the command. Its pid cannot have been reused: the
/// command is reaped only by `try_wait`, after which nothing is sent.
fn send(child: &Child, signal: Signal) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // It may have ended (a zombie) already: nothing to do then.
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// Why the command could not start: the shell's 127 for not found, 126
/// for anything else.
fn spawn_failure(program: &OsStr, e: &io::Error) -> Failure {
    let (code, kind) = match e.kind() {
        io::ErrorKind::NotFound => (exit::NOT_FOUND, "not_found"),
        _ => (exit::CANNOT_RUN, "cannot_run"),
    };
    Failure::new(
        code,
        kind,
        format!(
            "cannot run `{}` (the lock was released): {e}",
            program.to_string_lossy()
        ),
    )
}
