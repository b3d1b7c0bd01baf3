//! What the tool's tests share: running the real `redlock` binary against
//! a throwaway cluster of real `redis-server` nodes, and waiting on
//! conditions with a deadline instead of sleeping.

#![allow(dead_code)] // each test binary uses its own share of these

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use redlock_sync_testing::Cluster;

/// How long any awaited condition may take before the test fails. Long
/// next to what the tests wait for (a second or two): it only bounds a
/// broken run.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A cluster of `n` real nodes; fails with the harness's message (how to
/// install redis-server) if it cannot start.
pub fn cluster(n: usize) -> Cluster {
    Cluster::start(n).unwrap_or_else(|e| panic!("cannot start {n} redis-server nodes: {e}"))
}

/// `redlock SUBCOMMAND --nodes <the cluster's nodes>`, with nothing taken
/// from the environment of the test, and timeouts of 2 s: the defaults
/// (50 ms) are tight for a debug build on a busy 2-core machine running
/// tests side by side (a TLS handshake, a node that is slow to be
/// scheduled), and no test here needs a node to time out.
pub fn redlock(subcommand: &str, cluster: &Cluster) -> Command {
    let mut cmd = bare();
    cmd.arg(subcommand)
        .arg("--nodes")
        .arg(cluster.urls().join(","))
        .args(["--io-timeout", "2s", "--connect-timeout", "2s"]);
    cmd
}

/// The `redlock` binary, with no `REDLOCK_*` variables from the test's
/// environment.
pub fn bare() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_redlock"));
    for var in [
        "REDLOCK_NODES",
        "REDLOCK_TOKEN",
        "REDLOCK_RESOURCE",
        "REDLOCK_FENCING_TOKEN",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs `cmd` to its end (within [`PATIENCE`]) and returns its output.
pub fn output(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the redlock binary starts");
    // Read both pipes while it runs, so that it never blocks writing.
    let stdout = child.stdout.take().map(read_all);
    let stderr = child.stderr.take().map(read_all);
    let status = Tool::new(child).wait(PATIENCE);
    let collect = |reader: Option<std::thread::JoinHandle<Vec<u8>>>| {
        reader.map_or_else(Vec::new, |r| r.join().unwrap_or_default())
    };
    Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    }
}

fn read_all(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// The exit code of a finished tool; fails the test if it died of a
/// signal.
pub fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or_else(|| {
        panic!(
            "redlock died of a signal: {:?}; stderr: {}",
            output.status,
            text(&output.stderr)
        )
    })
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running `redlock`, killed and reaped if the test ends first.
pub struct Tool {
    child: Option<Child>,
    /// Its standard error, line by line, if it was piped.
    lines: Option<Receiver<String>>,
    /// The lines read so far.
    pub stderr: Vec<String>,
}

impl Tool {
    /// Starts `cmd` with its standard error piped (read line by line on a
    /// thread).
    pub fn spawn(cmd: &mut Command) -> Tool {
        let mut child = cmd
            .stderr(Stdio::piped())
            .spawn()
            .expect("the redlock binary starts");
        let lines = child.stderr.take().map(read_lines);
        let mut tool = Tool::new(child);
        tool.lines = lines;
        tool
    }

    fn new(child: Child) -> Tool {
        Tool {
            child: Some(child),
            lines: None,
            stderr: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Waits for a line of standard error that contains `needle`.
    pub fn wait_for_stderr(&mut self, needle: &str) {
        let lines = self.lines.as_ref().expect("stderr is piped");
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.stderr.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "redlock never said {needle:?} on stderr; it said: {:?}",
                    self.stderr
                ),
            }
        }
    }

    /// Sends `signal` (a `kill` name such as `TERM`) to the tool.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Whether it has ended (without reaping it for good: `wait` still
    /// gives the status).
    pub fn has_ended(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        child.try_wait().expect("try_wait works").is_some()
    }

    /// Waits for the tool to end, up to `limit`; fails the test past it.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait works") {
                // Its standard error ends when every process that has it
                // is gone: the command's too, which must not outlive it.
                while let Some(lines) = &self.lines {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match lines.recv_timeout(left) {
                        Ok(line) => self.stderr.push(line),
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                            "redlock ended, but its standard error was still open {limit:?} \
                             after it started waiting (a process of its command lives on); \
                             stderr so far: {:?}",
                            self.stderr
                        ),
                    }
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "redlock did not end within {limit:?}; stderr so far: {:?}",
                self.stderr
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the tool to end (within [`PATIENCE`]); fails the test,
    /// with what it said, unless it exited with 0.
    pub fn succeeds(&mut self) {
        let code = self.wait(PATIENCE).code();
        assert_eq!(code, Some(0), "{}", self.stderr_text());
    }

    /// Everything it said on stderr (after `wait`).
    pub fn stderr_text(&self) -> String {
        self.stderr.join("\n")
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn read_lines(stderr: ChildStderr) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Polls `condition` every 10 ms until it holds; fails the test with
/// `what` if it does not within [`PATIENCE`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A scratch file in the cluster's directory (removed with the cluster).
pub fn scratch(cluster: &Cluster, name: &str) -> PathBuf {
    cluster.dir().join(name)
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// How many nodes hold `resource` with `token` (or with the token of a
/// value `token` read from a node): the stored value is the token, then a
/// space and the owner label.
pub fn holders(cluster: &Cluster, resource: &str, token: &str) -> usize {
    let token = token.split(' ').next();
    let held = |value: Option<String>| value.is_some_and(|v| v.split(' ').next() == token);
    cluster
        .nodes()
        .iter()
        .filter(|node| held(node.get(resource).ok().flatten()))
        .count()
}

/// How many nodes have any key for `resource`.
pub fn keys_on(cluster: &Cluster, resource: &str) -> usize {
    cluster
        .nodes()
        .iter()
        .filter(|node| node.get(resource).ok().flatten().is_some())
        .count()
}

/// On how many nodes `key` exists, whatever its type.
pub fn exists_on(cluster: &Cluster, key: &str) -> usize {
    let exists = |node: &&redlock_sync_testing::Node| {
        node.query(&["EXISTS", key]).ok() == Some(redis::Value::Int(1))
    };
    cluster.nodes().iter().filter(exists).count()
}

/// A shell command line for the child: `sh -c SCRIPT`.
pub fn sh(script: &str) -> [String; 3] {
    ["sh".into(), "-c".into(), script.into()]
}

/// The pids whose parent is `parent` (from `/proc`).
pub fn children_of(parent: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc")
        .expect("/proc is mounted")
        .flatten()
    {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = read(&entry.path().join("stat"));
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        if ppid == Some(parent) {
            children.push(pid);
        }
    }
    children
}

/// Whether any process is left in process group `pgid`.
pub fn group_alive(pgid: &str) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status()
        .expect("kill runs")
        .success()
}

/// A command that writes its process group's id to `pgid`, leaves a
/// grandchild (`sleep 30`) in the background, and writes `mark` with a
/// count to `marks` every 20 ms.
pub fn marking(pgid: &std::path::Path, marks: &std::path::Path, mark: &str) -> [String; 3] {
    sh(&format!(
        "sleep 30 & echo $$ > '{p}.tmp'; mv '{p}.tmp' '{p}'; i=0; \
         while :; do i=$((i+1)); echo '{mark}' $i >> '{m}'; sleep 0.02; done",
        p = pgid.display(),
        m = marks.display(),
    ))
}

/// Starts a second run on `resource` that waits for the lock, marks `b`
/// when its command starts, and ends at once; returns once it did. Then
/// checks that no `a` mark came after `b`.
pub fn second_run_never_overlaps(cluster: &Cluster, resource: &str, marks: &std::path::Path) {
    let out = output(
        redlock("run", cluster)
            .args(["--retry-delay", "50ms", "--wait", "15s", resource, "--"])
            .args(sh(&format!(
                "echo b >> '{m}'; sleep 0.3; echo b-end >> '{m}'",
                m = marks.display()
            ))),
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let seen = read(marks);
    let after_b = seen
        .split_once("b\n")
        .map(|(_, rest)| rest)
        .expect("the second run's mark");
    assert_eq!(after_b, "b-end\n", "the first command ran on: {seen}");
}

/// Starts `redlock run --ttl 2s RESOURCE -- <marking command>` (with `job`,
/// in a process group of its own, as a job runner starts a job: its pid
/// is its group's id), calls `signal` with its pid once the command runs,
/// and checks that every process of the command's group is gone within
/// the TTL and that a second run never overlaps it. Returns the tool.
pub fn command_group_ends_within_the_ttl(
    cluster: &Cluster,
    resource: &str,
    job: bool,
    signal: impl FnOnce(u32),
) -> Tool {
    let (pgid, marks) = (scratch(cluster, "pgid"), scratch(cluster, "marks"));
    let mut cmd = redlock("run", cluster);
    cmd.args(["--ttl", "2s", resource, "--"])
        .args(marking(&pgid, &marks, "a"));
    if job {
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    }
    let tool = Tool::spawn(&mut cmd);
    wait_until("the command started", || pgid.exists());
    let group = read(&pgid).trim().to_string();
    signal(tool.pid());
    let signalled = Instant::now();
    wait_until("the command's group is gone", || !group_alive(&group));
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "gone {:?} after the signal, more than the TTL",
        signalled.elapsed()
    );
    second_run_never_overlaps(cluster, resource, &marks);
    tool
}

/// Sends `signal` (a `kill` name) to process `pid`, or with `group` to
/// every process of group `pid`.
pub fn kill(signal: &str, pid: u32, group: bool) {
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    let status = Command::new("kill")
        .args([&format!("-{signal}"), "--", &target])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {target} failed");
}

/// How many subscribers the nodes have, in all, on the channel where the
/// releases of `resource` are said (see the library's `Patience`):
/// a waiter inside the library's wait listens there.
pub fn listeners(cluster: &Cluster, resource: &str) -> i64 {
    let channel = redlock_sync::released_channel(resource);
    let count =
        |node: &redlock_sync_testing::Node| match node.query(&["PUBSUB", "NUMSUB", &channel]) {
            Ok(redis::Value::Array(reply)) => match reply.get(1) {
                Some(redis::Value::Int(n)) => *n,
                _ => 0,
            },
            _ => 0,
        };
    cluster.nodes().iter().map(count).sum()
}

/// The instants (`date +%s.%N`, in seconds) that a command wrote to `path`
/// by [`stamp`], one a line, after each line's label.
pub fn stamps(path: &Path) -> Vec<(String, f64)> {
    read(path)
        .lines()
        .filter_map(|line| {
            let (label, at) = line.split_once(' ')?;
            Some((label.to_string(), at.parse().ok()?))
        })
        .collect()
}

/// A shell step that appends `label` and the time now to `path`, for
/// [`stamps`].
pub fn stamp(path: &Path, label: &str) -> String {
    format!("echo \"{label} $(date +%s.%N)\" >> '{}'", path.display())
}

/// The members of `resource`'s sorted set on each node: the holders of a
/// `--shared` or `--semaphore` lock (0 where the key is absent).
pub fn members_on(cluster: &Cluster, resource: &str) -> Vec<i64> {
    // Holders only: the kind's marker member is scored -inf.
    let holders = ["ZCOUNT", resource, "(-inf", "+inf"];
    let count = |node: &redlock_sync_testing::Node| match node.query(&holders) {
        Ok(redis::Value::Int(n)) => n,
        _ => 0,
    };
    cluster.nodes().iter().map(count).collect()
}

/// This host's name, as the tool's default owner label has it
/// (`HOST:PID`).
pub fn host_name() -> String {
    let name = read(Path::new("/proc/sys/kernel/hostname"));
    let name = name.trim();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name.to_string()
    }
}
