//! The command's process tree: every process descended from the one that
//! looks (the supervisor, or `run` once the supervisor is gone). And how to
//! stop them all without ever signalling a process that is not one of them.
//!
//! A process group is not enough. `timeout(1)`, `bash -m`, `setsid` and a
//! daemon's double fork each move a step out of the command's group, and
//! such a step would write on after the lock is lost. Descent is what
//! lasts. On Linux the supervisor and `run` are child subreapers
//! (`PR_SET_CHILD_SUBREAPER`). A process whose parent dies is re-parented
//! to the nearest living subreaper above it. So a process that descends
//! from the supervisor does so until it is gone, whatever group or session
//! it moves to. `/proc/*/stat` gives each process's parent; the tree is
//! every process whose line of parents leads up to the looker
//! ([`descendants_of`]).
//!
//! What `/proc` shows may be stale by the time a signal is sent: the
//! process may have died and its pid gone to an unrelated process. So a
//! process is signalled only where that cannot happen ([`signal`]):
//!
//! - a child of the looker, by its pid. The pid stays the child's until
//!   the looker reaps it (a zombie keeps its pid), and the looker reaps
//!   only after signalling (one thread does both).
//! - a deeper descendant, through a pidfd (`pidfd_open`, Linux 5.3). The
//!   pidfd names whoever has the pid when it is opened. If `/proc` then
//!   still shows the start time seen, that is the process seen, and the
//!   pidfd keeps naming it whatever happens to the pid. Where pidfds are
//!   missing it is left alone: once its parent dies it is the looker's
//!   child, and is signalled then.
//!
//! Stopping the tree is a loop: SIGKILL to every process of it, reap, look
//! again, until the looker has no child left (`waitpid` says `ECHILD`).
//! No race can fake that: a descendant needs a living line of parents up
//! to the looker, and the looker's children are its own to reap. A process
//! that forks meanwhile is caught, as its child descends from the looker
//! too, and a process with SIGKILL pending cannot fork. What survives
//! (uninterruptible sleep, another user's process) is named by
//! [`Process`]'s `Display`. Its holder decides what to do: keep the lock
//! while it lives (see `run.rs`).
//!
//! Not a freeze first (SIGSTOP to all, then SIGKILL): SIGKILL pending
//! already stops a process from forking. A SIGSTOP to a deeper process
//! would need the same care about pids. Not a cgroup, which would also
//! hold a fork bomb: a command-line tool cannot count on a delegated
//! cgroup (`systemd-run --scope` gives one; see the README).
//!
//! Elsewhere (no `/proc`, no subreaper) the tree is empty and the callers
//! fall back to the command's process group.

use std::fmt;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// A process of the tree, as `/proc` showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: i32,
    ppid: i32,
    /// Its process group.
    pgrp: i32,
    /// The state letter: `R`, `S`, `D` (uninterruptible sleep), `T`, `Z`.
    state: char,
    /// The command name (`comm`).
    name: String,
    /// When it started, in clock ticks since boot: with the pid, which
    /// process this is.
    start: u64,
}

impl fmt::Display for Process {
    /// `pid 123 (sleep)`, with what keeps it alive where `/proc` tells:
    /// `pid 123 (cat; uninterruptible sleep)`, `pid 9 (sh; uid 65534)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} ({}", self.pid, self.name)?;
        match self.state {
            'D' => write!(f, "; uninterruptible sleep")?,
            'Z' => write!(f, "; a zombie")?,
            _ => {}
        }
        match owner(self.pid) {
            Some(uid) if Some(uid) != owner(me()) => write!(f, "; uid {uid}")?,
            _ => {}
        }
        write!(f, ")")
    }
}

impl Process {
    /// Whether it was in process group `pgid`.
    pub fn in_group(&self, pgid: i32) -> bool {
        self.pgrp == pgid
    }
}

/// The processes named one after the other, for a message.
pub fn list(processes: &[Process]) -> String {
    let names: Vec<String> = processes.iter().map(ToString::to_string).collect();
    names.join(", ")
}

/// Every process descended from `root` (its children, theirs, and so on),
/// as `/proc` shows them now; empty without `/proc` (not Linux).
pub fn descendants_of(root: i32) -> Vec<Process> {
    let all = scan();
    let mut found: Vec<Process> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for process in all.iter().filter(|p| p.ppid == parent) {
            // A pid listed twice (read while re-parented) counts once.
            if !found.iter().any(|seen| seen.pid == process.pid) {
                parents.push(process.pid);
                found.push(process.clone());
            }
        }
    }
    found
}

/// Every process descended from this one.
pub fn descendants() -> Vec<Process> {
    descendants_of(me())
}

/// Sends `signal` to each of `processes` that is still the process seen,
/// as [`descendants`] found it. A child gets it by its pid, a deeper one
/// through a pidfd checked against its start time (see the module's head).
/// Returns how many got it.
pub fn signal(processes: &[Process], signal: Signal) -> usize {
    let me = me();
    let sent = |process: &Process| {
        if process.ppid == me {
            // Our child until we reap it: the pid cannot be another's.
            kill(Pid::from_raw(process.pid), signal).is_ok()
        } else {
            by_pidfd(process, signal)
        }
    };
    processes.iter().filter(|p| sent(p)).count()
}

/// Reaps every child of this process that has ended or stopped, giving
/// each status to `each`; returns whether any child is left.
pub fn reap(mut each: impl FnMut(WaitStatus)) -> bool {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
            Ok(WaitStatus::StillAlive) => return true,
            Ok(status) => each(status),
            Err(Errno::EINTR) => {}
            // ECHILD: none is left. Any other error would come again.
            Err(_) => return false,
        }
    }
}

fn me() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// Every process in `/proc` whose `stat` parses.
#[cfg(target_os = "linux")]
fn scan() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

#[cfg(not(target_os = "linux"))]
fn scan() -> Vec<Process> {
    Vec::new()
}

/// Process `pid` as `/proc/PID/stat` shows it now: `pid (comm) state ppid
/// ...`, its start time the 22nd field. `comm` may hold spaces and
/// parentheses: the fields after it follow its last `)`.
#[cfg(target_os = "linux")]
fn stat(pid: i32) -> Option<Process> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = text.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Process {
        pid,
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        name,
    })
}

/// The real uid of process `pid` (`/proc/PID/status`).
fn owner(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// Signals `process` through a pidfd, if it is still the process seen.
#[cfg(target_os = "linux")]
fn by_pidfd(process: &Process, signal: Signal) -> bool {
    use rustix::process::{pidfd_open, pidfd_send_signal, PidfdFlags};
    let (Some(pid), Some(signal)) = (
        rustix::process::Pid::from_raw(process.pid),
        rustix::process::Signal::from_named_raw(signal as i32),
    ) else {
        return false;
    };
    // Gone, or no pidfds (before Linux 5.3): reached once it is our child.
    let Ok(pidfd) = pidfd_open(pid, PidfdFlags::empty()) else {
        return false;
    };
    // Opened before this look: if the pid still shows the start time
    // seen, the pidfd names the process seen.
    if stat(process.pid).map(|now| now.start) != Some(process.start) {
        return false;
    }
    pidfd_send_signal(&pidfd, signal).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn by_pidfd(_: &Process, _: Signal) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_read_from_proc_with_a_name_that_holds_spaces_and_parentheses() {
        let me = stat(me()).expect("our own stat");
        assert_eq!(me.ppid, nix::unistd::getppid().as_raw());
        assert!(me.start > 0);
        // The command name comes from the file run: a link with an odd name.
        let dir = std::env::temp_dir().join(format!("redlock-tree-{}", me.pid));
        std::fs::create_dir_all(&dir).unwrap();
        let odd = dir.join("a b) (c");
        let _ = std::fs::remove_file(&odd);
        std::os::unix::fs::symlink("/bin/sleep", &odd).unwrap();
        let mut child = std::process::Command::new(&odd).arg("30").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let seen = stat(pid).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!((seen.ppid, seen.name.as_str()), (me.pid, "a b) (c"));
        let found = descendants();
        assert!(
            found.iter().any(|p| (p.pid, p.start) == (pid, seen.start)),
            "{found:?}"
        );
        // Read during its exec, the child may be in uninterruptible sleep,
        // which the name then says: the name's part is checked asleep.
        let asleep = Process {
            state: 'S',
            ..seen.clone()
        };
        assert_eq!(asleep.to_string(), format!("pid {pid} (a b) (c)"));
        assert_eq!(signal(&[seen], Signal::SIGKILL), 1);
        let _ = child.wait();
    }

    #[test]
    fn a_deeper_process_is_signalled_only_while_its_start_time_is_the_one_seen() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let seen = descendants()
            .into_iter()
            .find(|p| p.pid == grandchild)
            .expect("the grandchild descends from us");
        let mut stale = seen.clone();
        stale.start += 1;
        assert_eq!(signal(&[stale], Signal::SIGKILL), 0, "a pid reused");
        assert!(
            stat(grandchild).is_some(),
            "signalled though not the one seen"
        );
        assert_eq!(signal(&[seen], Signal::SIGKILL), 1);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "sh's wait ended");
    }
}
