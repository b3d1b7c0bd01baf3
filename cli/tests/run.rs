//! `redlock run`, the real binary against real redis-server nodes: turns,
//! conflicts, keep-alive, loss, exit statuses and signals.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlock_sync_testing::Cluster;

/// The two kinds of lock `run` holds, both kept alive by the library's
/// `LockGuard`: plain and `--fenced`.
const MODES: [&[&str]; 2] = [&[], &["--fenced"]];

/// A `redlock run` whose command holds `resource` until [`finish`](Self::finish).
struct Holder {
    tool: Tool,
    gate: std::path::PathBuf,
}

impl Holder {
    /// Starts it, and waits until its command runs (under the lock).
    fn start(cluster: &Cluster, resource: &str) -> Holder {
        let (started, gate) = (scratch(cluster, "started"), scratch(cluster, "gate"));
        let tool = Tool::spawn(
            redlock("run", cluster)
                .args(["--ttl", "2s", resource, "--"])
                .args(sh(&format!(
                    "echo started > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
                    started.display(),
                    gate.display()
                ))),
        );
        wait_until("the holder's command started", || started.exists());
        Holder { tool, gate }
    }

    /// Lets its command end; returns the tool's exit code.
    fn finish(mut self) -> Option<i32> {
        std::fs::write(&self.gate, "").unwrap();
        self.tool.wait(PATIENCE).code()
    }
}

#[test]
fn two_runs_on_one_resource_take_turns_and_their_commands_never_overlap() {
    let cluster = cluster(3);
    let marks = scratch(&cluster, "marks");
    let (started, gate) = (scratch(&cluster, "started"), scratch(&cluster, "gate"));
    let step = |name: &str, wait_for_gate: bool| {
        let gate_wait = if wait_for_gate {
            format!("while [ ! -e '{}' ]; do sleep 0.02; done; ", gate.display())
        } else {
            String::new()
        };
        sh(&format!(
            "echo 'start {name}' >> '{m}'; echo started > '{s}'; {gate_wait}sleep 0.1; echo 'end {name}' >> '{m}'",
            m = marks.display(),
            s = started.display(),
        ))
    };

    let mut first = Tool::spawn(
        redlock("run", &cluster)
            .args(["--ttl", "2s", "turns", "--"])
            .args(step("first", true)),
    );
    wait_until("the first command started", || started.exists());
    // The second waits (it says so with -v), then runs once the first ends.
    let mut second = Tool::spawn(
        redlock("run", &cluster)
            .args(["-v", "--ttl", "2s", "--retry-delay", "50ms", "turns", "--"])
            .args(step("second", false)),
    );
    second.wait_for_stderr("waiting for `turns`");
    assert_eq!(
        read(&marks),
        "start first\n",
        "the second ran while the first held the lock"
    );
    std::fs::write(&gate, "").unwrap();

    first.succeeds();
    second.succeeds();
    assert_eq!(
        read(&marks),
        "start first\nend first\nstart second\nend second\n"
    );
    assert_eq!(keys_on(&cluster, "turns"), 0, "the lock is released");
}

#[test]
fn no_wait_exits_with_the_conflict_code_and_never_runs_the_command() {
    let cluster = cluster(3);
    let holder = Holder::start(&cluster, "busy");

    let ran = scratch(&cluster, "ran");
    let touch = ["touch".to_string(), ran.display().to_string()];
    let out = output(
        redlock("run", &cluster)
            .args(["-n", "busy", "--"])
            .args(&touch),
    );
    assert_eq!(code(&out), 75, "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("held by another client"),
        "{}",
        text(&out.stderr)
    );

    let out = output(
        redlock("run", &cluster)
            .args([
                "--no-wait",
                "--conflict-exit-code",
                "9",
                "--json",
                "busy",
                "--",
            ])
            .args(&touch),
    );
    assert_eq!(code(&out), 9);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(json["error"], "conflict");
    assert_eq!(json["exit_code"], 9);
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(3));

    let out = output(
        redlock("run", &cluster)
            .args(["--wait", "300ms", "busy", "--"])
            .args(&touch),
    );
    assert_eq!(code(&out), 75);
    assert!(
        text(&out.stderr).contains("gave up waiting for `busy`"),
        "{}",
        text(&out.stderr)
    );
    assert!(!ran.exists(), "a command ran without the lock");

    assert_eq!(holder.finish(), Some(0));
}

#[test]
fn a_waiting_run_starts_within_two_seconds_of_the_holders_end_not_at_its_ten_second_retry() {
    for mode in MODES {
        let cluster = cluster(3);
        let marks = scratch(&cluster, "marks");
        let (started, gate) = (scratch(&cluster, "started"), scratch(&cluster, "gate"));
        let mut first = Tool::spawn(
            redlock("run", &cluster)
                .args(mode)
                .args(["--ttl", "5s", "wake", "--"])
                .args(sh(&format!(
                    "echo started > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; {}",
                    started.display(),
                    gate.display(),
                    stamp(&marks, "end")
                ))),
        );
        wait_until("the first command started", || started.exists());
        // A retry delay far longer than the bound below: only the news of
        // the release can start it in time.
        let mut second = Tool::spawn(
            redlock("run", &cluster)
                .args(mode)
                .args(["-v", "--ttl", "5s", "--retry-delay", "10s", "wake", "--"])
                .args(sh(&stamp(&marks, "start"))),
        );
        second.wait_for_stderr("waiting for `wake`");
        // Inside the library's wait: subscribed to the resource's releases.
        wait_until("the second run listens for the release", || {
            listeners(&cluster, "wake") >= 1
        });
        std::fs::write(&gate, "").unwrap();

        first.succeeds();
        second.succeeds();
        let marks = stamps(&marks);
        let labels: Vec<&str> = marks.iter().map(|(label, _)| label.as_str()).collect();
        assert_eq!(labels, ["end", "start"], "mode {mode:?}");
        let gap = marks[1].1 - marks[0].1;
        assert!(
            gap < 2.0,
            "mode {mode:?}: the second command started {gap:.3} s after the first ended"
        );
        assert_eq!(keys_on(&cluster, "wake"), 0, "the lock is released");
    }
}

#[test]
fn a_command_that_runs_three_ttls_keeps_the_lock_the_whole_time() {
    for mode in MODES {
        let cluster = cluster(3);
        let (env, done) = (scratch(&cluster, "env"), scratch(&cluster, "done"));
        let mut tool = Tool::spawn(
            redlock("run", &cluster)
                .args(["--ttl", "1500ms", "--retry-delay", "50ms"])
                .args(mode)
                .args(["long", "--"])
                .args(sh(&format!(
                    "echo \"$REDLOCK_RESOURCE $REDLOCK_TOKEN $REDLOCK_FENCING_TOKEN\" > '{}.tmp'; \
                     mv '{0}.tmp' '{0}'; sleep 4.5; echo done > '{1}'",
                    env.display(),
                    done.display()
                ))),
        );
        wait_until("the command wrote its environment", || env.exists());
        let seen = read(&env);
        let fields: Vec<&str> = seen.split_whitespace().collect();
        assert_eq!(fields[0], "long");
        let token = fields[1].to_string();
        assert_eq!(
            token.len(),
            40,
            "REDLOCK_TOKEN is the lock's token: {seen:?}"
        );
        if mode.is_empty() {
            assert_eq!(
                fields.len(),
                2,
                "no fencing token without --fenced: {seen:?}"
            );
        } else {
            assert!(
                fields[2].parse::<u64>().is_ok(),
                "a fencing token: {seen:?}"
            );
        }

        // Until the command ends, a quorum holds the token (the command
        // says it ended before the lock is released, so a release is never
        // taken for a lapse); and past two TTLs another run is refused.
        let start = Instant::now();
        let mut refused_late = false;
        while !tool.has_ended() {
            assert!(
                holders(&cluster, "long", &token) >= 2 || done.exists(),
                "mode {mode:?}: the lock lapsed after {:?}",
                start.elapsed()
            );
            if !refused_late && start.elapsed() > Duration::from_millis(3300) {
                let out = output(redlock("run", &cluster).args(["-n", "long", "true"]));
                assert_eq!(code(&out), 75, "mode {mode:?}: {}", text(&out.stderr));
                refused_late = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(refused_late, "the command ended before two TTLs had passed");
        assert_eq!(
            tool.wait(PATIENCE).code(),
            Some(0),
            "mode {mode:?}: {}",
            tool.stderr_text()
        );
        assert_eq!(keys_on(&cluster, "long"), 0, "mode {mode:?}: released");
    }
}

#[test]
fn killing_a_majority_of_nodes_stops_the_command_with_the_lost_code() {
    for mode in MODES {
        let cluster = cluster(3);
        let started = scratch(&cluster, "started");
        let mut tool = Tool::spawn(
            redlock("run", &cluster)
                .args(["--ttl", "1s", "--retry-delay", "50ms"])
                .args(mode)
                .args(["fragile", "--"])
                .args(sh(&format!(
                    "echo started > '{}'; exec sleep 60",
                    started.display()
                ))),
        );
        wait_until("the command started", || started.exists());
        cluster.node(0).kill().unwrap();
        cluster.node(1).kill().unwrap();
        let killed = Instant::now();

        let status = tool.wait(PATIENCE);
        let took = killed.elapsed();
        let stderr = tool.stderr_text();
        assert_eq!(status.code(), Some(76), "mode {mode:?}: {stderr}");
        assert!(stderr.contains("was lost at"), "mode {mode:?}: {stderr}");
        assert!(stderr.contains("SIGTERM"), "mode {mode:?}: {stderr}");
        assert!(
            stderr.contains("signal: 15"),
            "mode {mode:?}: the command died of SIGTERM: {stderr}"
        );
        // The validity left at the kill is under one TTL, and the loss is
        // seen within a tick of its end: far from the command's 60 s.
        assert!(
            took < Duration::from_secs(3),
            "mode {mode:?}: stopped {took:?} after the nodes died"
        );
    }
}

#[test]
fn a_command_that_ignores_sigterm_gets_sigkill_after_kill_after() {
    let cluster = cluster(3);
    let started = scratch(&cluster, "started");
    let mut tool = Tool::spawn(
        redlock("run", &cluster)
            .args(["--ttl", "3s", "--kill-after", "200ms", "stubborn", "--"])
            .args(sh(&format!(
                "trap '' TERM; echo started > '{}'; while :; do sleep 0.02; done",
                started.display()
            ))),
    );
    wait_until("the command started", || started.exists());
    // Another client's token on every node: the next extension is
    // refused, a second before the lock would run out.
    for node in cluster.nodes() {
        node.set("stubborn", "another-clients-token").unwrap();
    }
    let status = tool.wait(PATIENCE);
    let stderr = tool.stderr_text();
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("SIGKILL 200ms later"), "{stderr}");
    assert!(stderr.contains("signal: 9"), "{stderr}");
}

#[test]
fn max_hold_stops_the_command_when_it_is_reached() {
    for mode in MODES {
        let cluster = cluster(3);
        let out = output(
            redlock("run", &cluster)
                .args(["--ttl", "1s", "--max-hold", "1500ms"])
                .args(mode)
                .args(["capped", "--", "sleep", "60"]),
        );
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 76, "mode {mode:?}: {stderr}");
        assert!(
            stderr.contains("held for --max-hold"),
            "mode {mode:?}: {stderr}"
        );
    }
}

#[test]
fn durations_too_long_for_the_clock_mean_no_limit_and_never_a_panic() {
    let cluster = cluster(3);
    let forever = "500000000000y";
    let out = output(redlock("run", &cluster).args([
        "--wait",
        forever,
        "--retry-delay",
        forever,
        "--max-hold",
        forever,
        "--kill-after",
        forever,
        "forever",
        "true",
    ]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));

    // Lost (at --max-hold) with a --kill-after that never comes: SIGTERM
    // only, never an early SIGKILL.
    let out = output(redlock("run", &cluster).args([
        "--ttl",
        "1s",
        "--max-hold",
        "1500ms",
        "--kill-after",
        forever,
        "forever",
        "--",
        "sleep",
        "60",
    ]));
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 76, "{stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert!(!stderr.contains("SIGKILL"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(keys_on(&cluster, "forever"), 0, "released");
}

#[test]
fn the_commands_exit_status_and_death_by_signal_are_passed_through() {
    let cluster = cluster(3);
    let out = output(
        redlock("run", &cluster)
            .args(["status", "--"])
            .args(sh("exit 7")),
    );
    assert_eq!(code(&out), 7, "{}", text(&out.stderr));
    assert!(
        out.stderr.is_empty(),
        "nothing to say: {}",
        text(&out.stderr)
    );

    let out = output(
        redlock("run", &cluster)
            .args(["status", "--"])
            .args(sh("kill -KILL $$")),
    );
    assert_eq!(code(&out), 128 + 9);

    let out = output(redlock("run", &cluster).args(["status", "true"]));
    assert_eq!(code(&out), 0);

    let out = output(redlock("run", &cluster).args(["status", "--", "/no/such/command"]));
    assert_eq!(code(&out), 127);
    assert!(
        text(&out.stderr).contains("cannot run `/no/such/command`"),
        "{}",
        text(&out.stderr)
    );

    assert_eq!(
        keys_on(&cluster, "status"),
        0,
        "every run released the lock"
    );
}

#[test]
fn sigterm_while_waiting_for_the_lock_ends_the_wait_at_once() {
    let cluster = cluster(3);
    let holder = Holder::start(&cluster, "queue");
    let token = {
        let nodes = cluster.nodes();
        nodes[0].get("queue").unwrap().expect("the holder's key")
    };

    let ran = scratch(&cluster, "ran");
    // A long retry delay: only the signal can end this wait quickly. The
    // library's wait ends within an --io-timeout of the cancellation (its
    // reads of the release channel last that long at most): shorter here
    // than the other tests' 2 s.
    let mut waiter = Tool::spawn(
        bare()
            .args(["run", "--nodes", &cluster.urls().join(",")])
            .args(["--io-timeout", "500ms", "--connect-timeout", "2s"])
            .args(["-v", "--retry-delay", "30s", "queue", "touch"])
            .arg(&ran),
    );
    waiter.wait_for_stderr("waiting for `queue`");
    // Inside the library's wait (subscribed to the resource's releases):
    // the signal cancels it.
    wait_until("the waiter listens for the release", || {
        listeners(&cluster, "queue") >= 1
    });
    waiter.signal("TERM");
    let signalled = Instant::now();
    let status = waiter.wait(Duration::from_secs(10));
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "ended {:?} after the signal",
        signalled.elapsed()
    );
    assert_eq!(status.code(), Some(128 + 15), "{}", waiter.stderr_text());
    assert!(waiter
        .stderr_text()
        .contains("stopped by signal 15 while waiting"));
    assert!(!ran.exists());
    assert!(
        holders(&cluster, "queue", &token) >= 2,
        "the holder still holds it"
    );

    assert_eq!(holder.finish(), Some(0));
    assert_eq!(keys_on(&cluster, "queue"), 0);
}

#[test]
fn sigterm_while_the_command_runs_is_passed_on_and_the_lock_released() {
    let cluster = cluster(3);
    let (started, got) = (scratch(&cluster, "started"), scratch(&cluster, "got"));
    let mut tool = Tool::spawn(
        redlock("run", &cluster)
            .args(["--ttl", "2s", "job", "--"])
            .args(sh(&format!(
                "trap 'echo TERM > \"{got}\"; exit 3' TERM; echo started > '{}'; \
                 while :; do sleep 0.02; done",
                started.display(),
                got = got.display()
            ))),
    );
    wait_until("the command started", || started.exists());
    assert!(keys_on(&cluster, "job") >= 2);
    tool.signal("TERM");
    let status = tool.wait(PATIENCE);
    assert_eq!(
        status.code(),
        Some(3),
        "the command's own status: {}",
        tool.stderr_text()
    );
    assert_eq!(read(&got), "TERM\n", "the command got the signal");
    assert_eq!(keys_on(&cluster, "job"), 0, "the lock is released");
}

#[test]
fn fenced_runs_in_turn_see_growing_fencing_tokens_and_leave_no_key() {
    let cluster = cluster(3);
    let seen = scratch(&cluster, "fencing");
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let out = output(
            redlock("run", &cluster)
                .args(["--fenced", "--no-wait", "ledger", "--"])
                .args(sh(&format!(
                    "echo \"$REDLOCK_FENCING_TOKEN\" > '{}'",
                    seen.display()
                ))),
        );
        assert_eq!(code(&out), 0, "stderr: {}", text(&out.stderr));
        let token: u64 = read(&seen)
            .trim()
            .parse()
            .expect("REDLOCK_FENCING_TOKEN is a number");
        tokens.push(token);
        // `--no-wait` would have failed had the last run left its key:
        // each run releases before it exits.
        assert_eq!(keys_on(&cluster, "ledger"), 0, "released at the end");
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "each fenced run gets a larger fencing token: {tokens:?}"
    );
}
