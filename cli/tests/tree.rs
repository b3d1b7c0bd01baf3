//! `redlock run` stops the command's whole process tree, not only its
//! process group: steps that left the group (`timeout(1)`, `bash -m`,
//! `setsid`, a daemon's double fork) are stopped on a lost lock, a signal
//! passed on, the lock's deadline, the command's own exit, and when the
//! supervisor dies; `run`
//! exits, and releases the lock, only once none is left, so that a second
//! run never holds the lock while one lives. A process that SIGKILL cannot
//! end (another user's) keeps the lock, named, until it is gone or the
//! lock is lost. The real binary against real redis-server nodes (Linux).

#![cfg(target_os = "linux")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use redlock_sync_testing::Cluster;

/// The steps, each of which leaves the command's process group its own
/// way.
const STEPS: [&str; 4] = ["timeout", "bash-m", "setsid", "double-fork"];

/// A step: ignores the signals a shell's job gets (only SIGKILL ends it),
/// says its pid once it runs, and writes its name to the marks every
/// 20 ms.
const STEP: &str = r#"trap '' TERM INT HUP
echo $$ > "$1.tmp"; mv "$1.tmp" "$1.pid"
while :; do echo "$2" >> "$3"; sleep 0.02; done
"#;

/// A command whose steps leave its process group, with the marks they
/// write, and a tag in their environment that tells them from any other
/// process (`/proc/PID/environ`).
struct Escapees {
    dir: PathBuf,
    marks: PathBuf,
    tag: String,
}

impl Escapees {
    fn new(cluster: &Cluster) -> Escapees {
        let dir = scratch(cluster, "steps");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("step.sh"), STEP).unwrap();
        // The cluster's directory is unique to this test and run.
        let tag: String = (cluster.dir().to_string_lossy().chars())
            .filter(char::is_ascii_alphanumeric)
            .collect();
        Escapees {
            marks: dir.join("marks"),
            dir,
            tag,
        }
    }

    /// The command (bash, with the tag in its environment): runs
    /// `before`, starts the four steps, says so, then runs `then` (`wait`,
    /// say).
    fn command(&self, before: &str, then: &str) -> Vec<String> {
        let d = self.dir.display();
        let step =
            |name: &str| format!("sh {d}/step.sh {d}/{name} {name} {}", self.marks.display());
        let script = [
            before.to_string(),
            // Its own process group (and it stays our child).
            format!("timeout 60 {} &", step("timeout")),
            // A job of a shell with job control, which needs a terminal:
            // script(1) gives it one, in a session of its own.
            format!(
                "script -qec 'bash -m -c \"{} & wait\"' /dev/null > /dev/null 2>&1 &",
                step("bash-m")
            ),
            format!("setsid {} &", step("setsid")),
            // A daemon: the middle process starts a session and leaves
            // its child (the step) an orphan.
            format!("( setsid sh -c '{} &' & )", step("double-fork")),
            format!("echo $$ > {d}/leader.tmp; mv {d}/leader.tmp {d}/leader"),
            then.to_string(),
        ]
        .join("\n");
        vec![
            "env".into(),
            format!("REDLOCK_TEST_TAG={}", self.tag),
            "bash".into(),
            "-c".into(),
            script,
        ]
    }

    fn pid_file(&self, step: &str) -> PathBuf {
        self.dir.join(format!("{step}.pid"))
    }

    /// Waits until every step runs and has written a mark; checks that
    /// each is out of the command's process group.
    fn wait_started(&self) {
        wait_until("every step started", || {
            STEPS.iter().all(|s| self.pid_file(s).exists())
                && STEPS.iter().all(|s| read(&self.marks).contains(s))
        });
        let leader = read(&self.dir.join("leader")).trim().to_string();
        for step in STEPS {
            let pid = read(&self.pid_file(step)).trim().to_string();
            let group = pgid(&pid).expect("the step runs");
            assert_ne!(group, leader, "{step} did not leave the command's group");
        }
    }

    /// The pids of the live processes with the tag: the command and all
    /// it started.
    fn alive(&self) -> Vec<u32> {
        let needle = format!("REDLOCK_TEST_TAG={}", self.tag);
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            // A zombie's environment reads empty: it runs no more.
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            if environ
                .split(|&b| b == 0)
                .any(|var| var == needle.as_bytes())
            {
                found.push(pid);
            }
        }
        found
    }

    /// Starts a second run on `resource` that waits for the lock; its
    /// command notes the processes with the tag alive as it starts, marks
    /// `b`, and ends. Returns once it waits inside the library (listening
    /// for the release).
    fn second_run(&self, cluster: &Cluster, resource: &str) -> Tool {
        let seen = self.dir.join("seen");
        let second = Tool::spawn(
            redlock("run", cluster)
                .args(["--retry-delay", "50ms", "--wait", "20s", resource, "--"])
                .args(sh(&format!(
                    "grep -lsz '^REDLOCK_TEST_TAG={}$' /proc/[0-9]*/environ > '{}'; \
                     echo b >> '{m}'",
                    self.tag,
                    seen.display(),
                    m = self.marks.display()
                ))),
        );
        wait_until("the second run waits", || listeners(cluster, resource) > 0);
        second
    }

    /// Checks what the second run saw as it started: none of the first
    /// run's processes alive, and no mark of them after its own.
    fn second_run_saw_none(&self, second: &mut Tool) {
        second.succeeds();
        let seen = read(&self.dir.join("seen"));
        assert_eq!(seen, "", "alive when the second run held the lock");
        let marks = read(&self.marks);
        let after = marks.split_once("b\n").expect("the second run's mark").1;
        assert_eq!(after, "", "a step wrote after the second run's mark");
    }

    fn assert_none_alive(&self, when: &str) {
        let alive = self.alive();
        assert!(alive.is_empty(), "{when}: alive: {alive:?}");
    }
}

impl Drop for Escapees {
    /// Where a test failed, no step of it outlives it: each gets SIGKILL,
    /// by pid, until none is left (bounded).
    fn drop(&mut self) {
        for _ in 0..100 {
            let alive = self.alive();
            if alive.is_empty() {
                return;
            }
            for pid in alive {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The process group of process `pid`, from `/proc/PID/stat`.
fn pgid(pid: &str) -> Option<String> {
    let stat = read(Path::new(&format!("/proc/{pid}/stat")));
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(2).map(str::to_string)
}

/// `redlock run ARGS RESOURCE -- <the escapees' command>`.
fn first_run(cluster: &Cluster, steps: &Escapees, args: &[&str], resource: &str) -> Tool {
    Tool::spawn(
        redlock("run", cluster)
            .args(args)
            .args([resource, "--"])
            .args(steps.command("", "wait")),
    )
}

#[test]
fn a_lost_lock_stops_every_step_that_left_the_command_group_before_run_exits() {
    let cluster = cluster(3);
    let steps = Escapees::new(&cluster);
    let args = [
        "--ttl",
        "1s",
        "--kill-after",
        "300ms",
        "--retry-delay",
        "50ms",
    ];
    let mut tool = first_run(&cluster, &steps, &args, "tree-lost");
    steps.wait_started();
    // Another client's on every node: the next extension is refused.
    for node in cluster.nodes() {
        node.set("tree-lost", "another-client").unwrap();
    }
    let status = tool.wait(PATIENCE);
    steps.assert_none_alive("as run exited");
    assert_eq!(status.code(), Some(76), "{}", tool.stderr_text());
    assert!(
        tool.stderr_text().contains("was lost"),
        "{}",
        tool.stderr_text()
    );
}

#[test]
fn a_signal_to_run_stops_every_step_that_left_the_command_group_before_the_release() {
    let cluster = cluster(3);
    let steps = Escapees::new(&cluster);
    let mut tool = first_run(&cluster, &steps, &["--kill-after", "300ms"], "tree-signal");
    steps.wait_started();
    let mut second = steps.second_run(&cluster, "tree-signal");
    // To the command's group: bash ends; the steps ignore SIGTERM and
    // are out of the group anyway.
    tool.signal("TERM");
    let status = tool.wait(PATIENCE);
    steps.assert_none_alive("as run exited");
    assert_eq!(status.code(), Some(143), "{}", tool.stderr_text());
    steps.second_run_saw_none(&mut second);
}

#[test]
fn steps_left_running_when_the_command_exits_are_stopped_before_the_release() {
    let cluster = cluster(3);
    let steps = Escapees::new(&cluster);
    let go = scratch(&cluster, "go");
    // The command exits once told, leaving its steps running.
    let then = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exit 3",
        go.display()
    );
    let mut tool = Tool::spawn(
        redlock("run", &cluster)
            .args(["--kill-after", "300ms", "tree-left", "--"])
            .args(steps.command("", &then)),
    );
    steps.wait_started();
    let mut second = steps.second_run(&cluster, "tree-left");
    std::fs::write(&go, "").unwrap();
    let status = tool.wait(PATIENCE);
    steps.assert_none_alive("as run exited");
    assert_eq!(status.code(), Some(3), "{}", tool.stderr_text());
    steps.second_run_saw_none(&mut second);
}

#[test]
fn the_deadline_stops_every_step_that_left_the_command_group_when_run_is_stopped() {
    let cluster = cluster(3);
    let steps = Escapees::new(&cluster);
    let mut tool = first_run(&cluster, &steps, &["--ttl", "2s"], "tree-deadline");
    steps.wait_started();
    kill("STOP", tool.pid(), false);
    let stopped = Instant::now();
    wait_until("every process of the command is gone", || {
        steps.alive().is_empty()
    });
    // With run stopped, only the supervisor's deadline stops them:
    // SIGKILL as the lock runs out (2 s), not --kill-after (10 s) after
    // SIGTERM, which they ignore. The margin is for a busy machine, where
    // a killed process may wait a while to be scheduled and die.
    assert!(
        stopped.elapsed() < Duration::from_secs(8),
        "gone {:?} after run stopped",
        stopped.elapsed()
    );
    tool.signal("CONT");
    let status = tool.wait(PATIENCE);
    assert_eq!(status.code(), Some(76), "{}", tool.stderr_text());
    steps.assert_none_alive("as run exited");
}

#[test]
fn a_killed_supervisor_has_every_step_that_left_the_command_group_stopped_before_the_release() {
    let cluster = cluster(3);
    let steps = Escapees::new(&cluster);
    let mut tool = first_run(&cluster, &steps, &["--ttl", "10s"], "tree-orphaned");
    steps.wait_started();
    let mut second = steps.second_run(&cluster, "tree-orphaned");
    let supervisor = children_of(tool.pid());
    assert_eq!(supervisor.len(), 1, "run's children: {supervisor:?}");
    kill("KILL", supervisor[0], false);
    let status = tool.wait(PATIENCE);
    steps.assert_none_alive("as run exited");
    assert_eq!(status.code(), Some(71), "{}", tool.stderr_text());
    steps.second_run_saw_none(&mut second);
}

#[test]
fn a_supervisor_killed_while_the_steps_start_has_the_whole_tree_stopped_before_the_release() {
    let cluster = cluster(3);
    let steps = Escapees::new(&cluster);
    let go = scratch(&cluster, "go");
    // Once told, the command kills its supervisor while its steps are
    // starting: forking, leaving the group, re-parented to `run` as it
    // looks for them.
    let command = steps.command(
        &format!("while [ ! -e '{}' ]; do sleep 0.01; done", go.display()),
        "kill -KILL $PPID; wait",
    );
    let mut tool = Tool::spawn(
        redlock("run", &cluster)
            .args(["--ttl", "10s", "tree-early", "--"])
            .args(command),
    );
    wait_until("the lock is taken", || keys_on(&cluster, "tree-early") > 0);
    let mut second = steps.second_run(&cluster, "tree-early");
    std::fs::write(&go, "").unwrap();
    let status = tool.wait(PATIENCE);
    steps.assert_none_alive("as run exited");
    assert_eq!(status.code(), Some(71), "{}", tool.stderr_text());
    steps.second_run_saw_none(&mut second);
}

/// The effective uid of the tests, from `/proc/self/status`.
fn euid() -> Option<u32> {
    let status = read(Path::new("/proc/self/status"));
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `nobody`'s `sleep 60`, started by a command of a `redlock` that cannot
/// kill it (root without CAP_KILL), killed by the test (root, with it)
/// when dropped.
struct Unkillable {
    pid_file: PathBuf,
}

impl Unkillable {
    /// `redlock run ARGS RESOURCE`, as root without CAP_KILL, whose command
    /// starts the process as `nobody` and exits 0; `None` where the tests
    /// cannot do so (not root, no setpriv).
    fn run(cluster: &Cluster, args: &[&str], resource: &str) -> Option<(Unkillable, Tool)> {
        let setpriv = Command::new("setpriv").arg("--version").output();
        if euid() != Some(0) || !setpriv.is_ok_and(|out| out.status.success()) {
            eprintln!("skipped: needs root and setpriv(1) to start another user's process");
            return None;
        }
        let pid_file = scratch(cluster, "nobody");
        // `redlock("run", cluster)`, run by setpriv.
        let template = redlock("run", cluster);
        let mut cmd = Command::new("setpriv");
        cmd.args(["--inh-caps=-kill", "--bounding-set=-kill"])
            .arg(template.get_program())
            .args(template.get_args())
            .args(args)
            .args([resource, "--"])
            // The command exits only once the sleep runs as nobody: before,
            // the tool (same user) could still kill it.
            .args(sh(&format!(
                "setpriv --reuid=65534 --regid=65534 --clear-groups sleep 60 & pid=$!; i=0; \
                 until grep -q '^Uid:[[:space:]]*65534' /proc/$pid/status || [ $i -ge 1000 ]; \
                 do i=$((i + 1)); sleep 0.01; done; \
                 echo $pid > '{p}.tmp'; mv '{p}.tmp' '{p}'",
                p = pid_file.display()
            )))
            .stdin(std::process::Stdio::null());
        for (var, value) in template.get_envs() {
            match value {
                Some(value) => cmd.env(var, value),
                None => cmd.env_remove(var),
            };
        }
        let unkillable = Unkillable { pid_file };
        let tool = Tool::spawn(&mut cmd);
        wait_until("the command started it", || unkillable.pid_file.exists());
        Some((unkillable, tool))
    }

    fn pid(&self) -> String {
        read(&self.pid_file).trim().to_string()
    }

    /// Kills it, if it is still nobody's sleep.
    fn kill(&self) {
        let pid = self.pid();
        let status = read(Path::new(&format!("/proc/{pid}/status")));
        if status.contains("Name:\tsleep") && status.contains("Uid:\t65534") {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    }
}

impl Drop for Unkillable {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn a_process_sigkill_cannot_end_keeps_the_lock_extended_and_named_until_it_is_gone() {
    let cluster = cluster(3);
    let args = ["--ttl", "2s", "--kill-after", "300ms"];
    let Some((survivor, mut tool)) = Unkillable::run(&cluster, &args, "tree-kept") else {
        return;
    };
    tool.wait_for_stderr("SIGKILL did not end 1 process");
    let said = tool.stderr_text();
    assert!(
        said.contains(&format!("pid {} (sleep; uid 65534)", survivor.pid()))
            && said.contains("the lock is kept (extended) until it is gone"),
        "{said}"
    );
    // Extended meanwhile: its time to live goes up again.
    let first = cluster.node(0).pttl("tree-kept").unwrap();
    wait_until("the lock is extended", || {
        cluster.node(0).pttl("tree-kept").unwrap() > first
    });
    let out = output(redlock("run", &cluster).args(["-n", "tree-kept", "true"]));
    assert_eq!(code(&out), 75, "{}", text(&out.stderr));

    survivor.kill();
    let status = tool.wait(PATIENCE);
    assert_eq!(status.code(), Some(0), "{}", tool.stderr_text());
    assert_eq!(
        keys_on(&cluster, "tree-kept"),
        0,
        "the lock was not released"
    );
}

#[test]
fn a_process_sigkill_cannot_end_is_named_and_run_exits_76_when_the_lock_reaches_max_hold() {
    let cluster = cluster(3);
    let args = ["--ttl", "2s", "--kill-after", "300ms", "--max-hold", "3s"];
    let Some((survivor, mut tool)) = Unkillable::run(&cluster, &args, "tree-capped") else {
        return;
    };
    let started = Instant::now();
    // Not `wait`: the survivor keeps run's standard error open.
    wait_until("run exits", || tool.has_ended());
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "run exited {:?} after the command started, before --max-hold",
        started.elapsed()
    );
    survivor.kill();
    let status = tool.wait(PATIENCE);
    assert_eq!(status.code(), Some(76), "{}", tool.stderr_text());
    let said = tool.stderr_text();
    assert!(
        said.contains("--max-hold")
            && said.contains(&format!("pid {} (sleep; uid 65534)", survivor.pid())),
        "{said}"
    );
}
