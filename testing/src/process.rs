//! A process known only by its pid: signals, and what Linux's `/proc` says
//! about it. Signals go through the `kill` program because std can signal
//! only its own children, and a cluster left by a killed run is not ours.
//!
//! Where there is no `/proc`, every question here answers "don't know"
//! (`None`), and the callers do nothing rather than guess.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{io_error, HarnessError};

/// Sleep between two looks at a process's state.
const STATE_POLL: Duration = Duration::from_millis(1);

/// Sends a signal to `pid` by running the `kill` program (`kill -STOP pid`).
pub(super) fn send_signal(signal: &str, pid: u32) -> Result<(), HarnessError> {
    let context = || format!("running `kill -{signal} {pid}`");
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| io_error(context(), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(io_error(
            context(),
            io::Error::other(format!("kill exited with {status}")),
        ))
    }
}

/// What `/proc/<pid>/stat` says: the one-letter state and the start time
/// (clock ticks after boot), which tells a process from a later one that
/// got the same pid.
struct Stat {
    state: char,
    start_time: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may contain anything, so read after the last
    // ')'. Field 3 (the state) comes first there, field 22 (starttime) 19th
    // after it.
    let mut fields = stat[stat.rfind(')')? + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_time })
}

/// Whether a state letter is a process that has exited (a zombie waiting for
/// its parent, or dead).
fn has_exited(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

/// The one-letter state of a process, where there is a `/proc` (Linux).
pub(super) fn state(pid: u32) -> Option<char> {
    stat(pid).map(|stat| stat.state)
}

/// The start time of `pid` if it is running (a zombie is not): with the pid,
/// it names one process for good.
pub(super) fn running_since(pid: u32) -> Option<u64> {
    stat(pid)
        .filter(|stat| !has_exited(stat.state))
        .map(|stat| stat.start_time)
}

/// Whether `pid` has exited: no `/proc` entry, or a zombie.
pub(super) fn is_gone(pid: u32) -> bool {
    state(pid).is_none_or(has_exited)
}

/// Waits, at most `within`, until `pid` has exited (see [`is_gone`]).
pub(super) fn wait_gone(pid: u32, within: Duration) {
    wait_until(pid, within, |state| state.is_none_or(has_exited));
}

/// The working folder of `pid` (`/proc/<pid>/cwd`).
pub(super) fn cwd(pid: u32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

/// The program `pid` runs (`/proc/<pid>/exe`), without the " (deleted)"
/// that Linux appends once the file was replaced or removed.
pub(super) fn exe(pid: u32) -> Option<PathBuf> {
    let exe = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
        Some(kept) => Some(PathBuf::from(kept)),
        None => Some(exe),
    }
}

/// Waits, at most `within`, until `done` holds for the process's state
/// (`None`: no such process, or no `/proc`).
pub(super) fn wait_until(pid: u32, within: Duration, done: impl Fn(Option<char>) -> bool) {
    let deadline = Instant::now() + within;
    while !done(state(pid)) && Instant::now() < deadline {
        thread::sleep(STATE_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Child;

    fn sleeper() -> Child {
        Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .expect("running `sleep 30`")
    }

    #[test]
    fn a_running_process_has_a_start_time_that_a_dead_one_lacks() {
        let mut child = sleeper();
        let pid = child.id();
        let since = running_since(pid).expect("a start time from /proc");
        assert_eq!(running_since(pid), Some(since), "the start time is stable");
        assert!(!is_gone(pid));
        assert_eq!(cwd(pid), std::env::current_dir().ok());
        assert!(
            exe(pid).is_some_and(|exe| exe.ends_with("sleep")),
            "{:?}",
            exe(pid)
        );

        // Killed but not yet reaped: a zombie, gone although /proc lists it.
        send_signal("KILL", pid).unwrap();
        wait_until(pid, Duration::from_secs(5), |state| state == Some('Z'));
        assert_eq!(state(pid), Some('Z'));
        assert!(is_gone(pid));
        assert_eq!(running_since(pid), None);

        child.wait().unwrap();
        assert_eq!(state(pid), None);
        assert!(is_gone(pid));
    }

    #[test]
    fn signalling_no_such_process_is_an_error() {
        let mut child = sleeper();
        let pid = child.id();
        child.kill().unwrap();
        child.wait().unwrap();
        let err = send_signal("CONT", pid).unwrap_err();
        assert!(
            err.to_string().contains(&format!("kill -CONT {pid}")),
            "{err}"
        );
    }
}
