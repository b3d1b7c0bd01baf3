//! `redlock run`'s command never runs on without the lock, however the
//! tool ends (killed, stopped, the lock lost); the terminal keeps working;
//! `acquire` never keeps a lock it could not hand over; quiet conflicts;
//! `-c`; the manual page and completions. The real binary against real
//! redis-server nodes.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use redlock_sync_testing::Cluster;

#[test]
fn kill_9_of_run_ends_its_whole_command_group_within_the_ttl_and_the_next_run_never_overlaps() {
    let cluster = cluster(3);
    let mut tool = command_group_ends_within_the_ttl(&cluster, "killed", false, |pid| {
        kill("KILL", pid, false)
    });
    tool.wait(PATIENCE);
}

#[test]
fn a_stopped_run_has_its_command_group_killed_when_the_lock_runs_out_and_the_next_run_never_overlaps(
) {
    let cluster = cluster(3);
    let mut tool = command_group_ends_within_the_ttl(&cluster, "stopped", false, |pid| {
        kill("STOP", pid, false)
    });
    tool.signal("CONT");
    let status = tool.wait(PATIENCE);
    assert_eq!(status.code(), Some(76), "{}", tool.stderr_text());
    assert!(
        tool.stderr_text()
            .contains("sent the command's processes SIGTERM"),
        "{}",
        tool.stderr_text()
    );
}

#[test]
fn a_lost_lock_ends_every_process_of_the_command_within_kill_after() {
    let scripts = [
        "sleep 40 & wait",
        // Two steps; the second writes a file 3 s in, unless stopped.
        "sleep 0.1; sh -c 'sleep 3; touch {step2}'",
    ];
    for script in scripts {
        let cluster = cluster(3);
        let (pgid, step2) = (scratch(&cluster, "pgid"), scratch(&cluster, "step2"));
        let script = script.replace("{step2}", &step2.display().to_string());
        let mut tool = Tool::spawn(
            redlock("run", &cluster)
                .args(["--ttl", "1s", "--kill-after", "1s", "--retry-delay", "50ms"])
                .args(["fragile", "--"])
                .args(sh(&format!(
                    "echo $$ > '{p}.tmp'; mv '{p}.tmp' '{p}'; {script}",
                    p = pgid.display()
                ))),
        );
        wait_until("the command started", || pgid.exists());
        let group = read(&pgid).trim().to_string();
        cluster.node(0).kill().unwrap();
        cluster.node(1).kill().unwrap();
        let killed = Instant::now();
        let status = tool.wait(PATIENCE);
        assert_eq!(status.code(), Some(76), "{script}: {}", tool.stderr_text());
        wait_until("the command's group is gone", || !group_alive(&group));
        // The lock runs out within a TTL of the nodes' death; the group
        // is gone within --kill-after of that.
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "{script}: gone {:?} after the nodes died",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_secs(3).saturating_sub(killed.elapsed()));
        assert!(!step2.exists(), "{script}: the second step ran on");
    }
}

#[test]
fn what_the_command_leaves_in_its_group_is_ended_before_the_lock_is_released() {
    let cluster = cluster(3);
    let bg = scratch(&cluster, "bg");
    let out = output(
        redlock("run", &cluster)
            .args(["-v", "leftover", "--"])
            .args(sh(&format!(
                "sleep 40 & echo $! > '{b}.tmp'; mv '{b}.tmp' '{b}'; exit 3",
                b = bg.display()
            ))),
    );
    assert_eq!(code(&out), 3, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("left processes running"),
        "{}",
        text(&out.stderr)
    );
    let pid = read(&bg).trim().to_string();
    let alive = Command::new("kill")
        .args(["-0", &pid])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(!alive, "the background sleep outlived the run");
    assert_eq!(keys_on(&cluster, "leftover"), 0);
}

/// A shell command line run under a pseudo-terminal (`script(1)`): what
/// it shows is read as it comes, and keys are typed at it.
struct Terminal {
    child: std::process::Child,
    keys: std::process::ChildStdin,
    shown: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Terminal {
    /// `redlock run --nodes <cluster> tty -- sh -c COMMAND; AFTER` under a
    /// terminal: `AFTER` runs in the shell that ran redlock.
    fn run(cluster: &Cluster, command: &str, after: &str) -> Terminal {
        let line = format!(
            "'{}' run --nodes {} --io-timeout 2s --connect-timeout 2s tty -- sh -c '{command}'; {after}",
            env!("CARGO_BIN_EXE_redlock"),
            cluster.urls().join(",")
        );
        let mut child = Command::new("script")
            .args(["-q", "-e", "-c", &line, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("script(1) runs (util-linux)");
        let keys = child.stdin.take().unwrap();
        let mut out = child.stdout.take().unwrap();
        let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let into = shown.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = out.read(&mut buf) {
                into.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Terminal { child, keys, shown }
    }

    fn shown(&self) -> String {
        self.shown.lock().unwrap().clone()
    }

    fn wait_for(&self, text: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !self.shown().contains(text) {
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {text:?}; it showed: {:?}",
                self.shown()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn type_keys(&mut self, keys: &str) {
        use std::io::Write;
        self.keys.write_all(keys.as_bytes()).unwrap();
        self.keys.flush().unwrap();
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_command_reads_the_terminal_and_the_terminal_is_back_after() {
    let cluster = cluster(3);
    let mut terminal = Terminal::run(
        &cluster,
        "echo ready; read a; echo got:$a",
        "read b; echo back:$b",
    );
    terminal.wait_for("ready");
    terminal.type_keys("one\n");
    terminal.wait_for("got:one");
    terminal.type_keys("two\n");
    terminal.wait_for("back:two");
}

#[test]
fn ctrl_z_does_not_suspend_the_command() {
    let cluster = cluster(3);
    let mut terminal = Terminal::run(&cluster, "echo ready; read a; echo got:$a", "echo done");
    terminal.wait_for("ready");
    // Ctrl-Z, with the command reading the terminal in the foreground.
    terminal.type_keys("\u{1a}");
    std::thread::sleep(Duration::from_millis(200));
    terminal.type_keys("one\n");
    terminal.wait_for("got:one");
    terminal.wait_for("done");
}

#[test]
fn acquire_that_cannot_hand_over_its_token_releases_the_lock_and_says_so() {
    let cluster = cluster(3);
    let broken = run_with_stdout(&cluster, StdoutKind::BrokenPipe);
    let full = run_with_stdout(&cluster, StdoutKind::Full);
    let closed = run_with_stdout(&cluster, StdoutKind::Closed);
    for (what, (code, stderr)) in [
        ("broken pipe", broken),
        ("/dev/full", full),
        ("closed", closed),
    ] {
        assert_eq!(code, Some(74), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        assert!(stderr.contains("standard output"), "{what}: {stderr}");
        assert_eq!(
            keys_on(&cluster, "handover"),
            0,
            "{what}: the lock is not kept"
        );
    }
}

enum StdoutKind {
    BrokenPipe,
    Full,
    Closed,
}

/// `redlock acquire handover` with its standard output `kind`; its exit
/// code and standard error.
fn run_with_stdout(cluster: &Cluster, kind: StdoutKind) -> (Option<i32>, String) {
    let mut cmd = match kind {
        StdoutKind::Closed => {
            let mut cmd = Command::new("sh");
            cmd.args([
                "-c",
                "exec \"$0\" \"$@\" >&-",
                env!("CARGO_BIN_EXE_redlock"),
            ])
            .args(["acquire", "--nodes", &cluster.urls().join(",")])
            .args(["--io-timeout", "2s", "--connect-timeout", "2s", "handover"])
            .stdin(Stdio::null());
            cmd
        }
        // A pipe nobody reads (`acquire | true`).
        StdoutKind::BrokenPipe => {
            let (reader, writer) = std::io::pipe().unwrap();
            drop(reader);
            let mut cmd = redlock("acquire", cluster);
            cmd.arg("handover").stdout(Stdio::from(writer));
            cmd
        }
        StdoutKind::Full => {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            let mut cmd = redlock("acquire", cluster);
            cmd.arg("handover").stdout(Stdio::from(full));
            cmd
        }
    };
    let mut tool = Tool::spawn(&mut cmd);
    let status = tool.wait(PATIENCE);
    (status.code(), tool.stderr_text())
}

#[test]
fn a_conflict_with_e_is_silent_without_v_and_one_short_line_without_e() {
    let cluster = cluster(3);
    let token = {
        let out = output(redlock("acquire", &cluster).arg("held"));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    };
    for sub in ["run", "acquire"] {
        let with = |args: &[&str]| {
            let mut cmd = redlock(sub, &cluster);
            cmd.args(args).arg("held");
            if sub == "run" {
                cmd.arg("true");
            }
            output(&mut cmd)
        };
        let quiet = with(&["-n", "-E", "0"]);
        assert_eq!(code(&quiet), 0, "{sub}");
        assert!(quiet.stdout.is_empty(), "{sub}: {}", text(&quiet.stdout));
        assert!(quiet.stderr.is_empty(), "{sub}: {}", text(&quiet.stderr));

        let verbose = with(&["-n", "-E", "0", "-v"]);
        assert_eq!(code(&verbose), 0, "{sub}");
        assert_eq!(
            text(&verbose.stderr).lines().count(),
            1,
            "{sub}: {}",
            text(&verbose.stderr)
        );

        let plain = with(&["-n"]);
        assert_eq!(code(&plain), 75, "{sub}");
        let line = text(&plain.stderr);
        assert_eq!(line, "redlock: `held` is held by another client\n", "{sub}");
    }
    let out = output(redlock("release", &cluster).args(["held", &token]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
}

#[test]
fn dash_c_runs_a_shell_command_line() {
    let cluster = cluster(3);
    let out = output(redlock("run", &cluster).args(["-c", "echo a; echo b", "shell"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "a\nb\n");

    let out = output(redlock("run", &cluster).args(["-c", "echo a", "shell", "echo", "b"]));
    assert_eq!(code(&out), 64, "-c and a COMMAND: {}", text(&out.stderr));
}

#[test]
fn the_manual_page_renders_and_the_bash_completions_parse() {
    let out = output(bare().arg("man"));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let page = scratch_file("redlock.1", &out.stdout);
    let rendered = Command::new("man")
        .args(["-l", "-P", "cat"])
        .arg(&page)
        .env("MANWIDTH", "80")
        .output()
        .expect("man runs (man-db)");
    assert!(rendered.status.success(), "{}", text(&rendered.stderr));
    let rendered = text(&rendered.stdout);
    for says in ["redlock", "acquire", "completions", "run"] {
        assert!(rendered.contains(says), "no {says}: {rendered}");
    }
    let out = output(bare().args(["man", "run"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("kill\\-after"),
        "{}",
        text(&out.stdout)
    );
    let dir = scratch_file("pages/.keep", b"")
        .parent()
        .unwrap()
        .to_path_buf();
    let out = output(bare().arg("man").arg("--dir").arg(&dir));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    for page in [
        "redlock.1",
        "redlock-run.1",
        "redlock-acquire.1",
        "redlock-status.1",
    ] {
        assert!(dir.join(page).exists(), "no {page}");
    }
    assert!(
        !dir.join("redlock-supervise.1").exists(),
        "a hidden subcommand's page"
    );

    // Into a pipe nobody reads: the output code, never a panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut tool = Tool::spawn(bare().arg("man").stdout(Stdio::from(writer)));
    let status = tool.wait(PATIENCE);
    assert_eq!(status.code(), Some(74), "{}", tool.stderr_text());
    assert!(!tool.stderr_text().contains("panicked"));

    let out = output(bare().args(["completions", "bash"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let script = scratch_file("redlock.bash", &out.stdout);
    let check = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(text(&out.stdout).contains("acquire"));
}

#[test]
fn man_dir_creates_the_folder_and_its_parents_and_each_synopsis_names_the_values() {
    let base = scratch_file("deep/.keep", b"")
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = base.join("share/man/man1");
    assert!(!dir.exists());
    let out = output(bare().arg("man").arg("--dir").arg(&dir));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let page = std::fs::read_to_string(dir.join("redlock-acquire.1")).unwrap();
    let synopsis = page
        .split_once(".SH SYNOPSIS\n")
        .and_then(|(_, rest)| rest.split_once("\n.SH "))
        .map(|(synopsis, _)| synopsis.to_string())
        .unwrap_or_else(|| panic!("no SYNOPSIS: {page}"));
    for says in [
        "\\fB\\-\\-ttl\\fR \\%\\fIDURATION\\fR",
        "\\fB\\-\\-semaphore\\fR \\%\\fIK\\fR",
        "\\fB\\-\\-owner\\fR \\%\\fILABEL\\fR",
        "\\%<\\fIRESOURCE\\fR>",
    ] {
        assert!(synopsis.contains(says), "no {says}: {synopsis}");
    }
    let out = output(bare().args(["man", "run"]));
    let rendered = Command::new("man")
        .args(["-l", "-P", "cat"])
        .arg(scratch_file("run.1", &out.stdout))
        .env("MANWIDTH", "200")
        .output()
        .expect("man runs (man-db)");
    // Justified lines get two blanks where one is written.
    let rendered = text(&rendered.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for says in [
        "[--kill-after DURATION]",
        "[-c|--command COMMAND_LINE]",
        "<RESOURCE> [COMMAND]...",
    ] {
        assert!(rendered.contains(says), "no {says}: {rendered}");
    }

    // A DIR that cannot be made is the output code, and says so.
    let file = scratch_file("not-a-folder", b"");
    let out = output(bare().arg("man").arg("--dir").arg(file.join("man1")));
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 74, "{stderr}");
    assert!(
        stderr.contains("cannot write the manual pages into"),
        "{stderr}"
    );
    assert!(!stderr.contains("standard output"), "{stderr}");
}

/// Writes `bytes` to a file of this name in a fresh directory.
fn scratch_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("redlock-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Makes `node` ask for a password that the cluster's URLs do not give.
fn require_a_password(node: &redlock_sync_testing::Node) {
    node.query(&["CONFIG", "SET", "requirepass", "s3cret"])
        .expect("CONFIG SET requirepass");
}

#[test]
fn nodes_refusing_the_password_fail_at_once_when_too_few_are_left_and_are_only_said_otherwise() {
    let cluster = cluster(3);
    for node in cluster.nodes() {
        require_a_password(node);
    }
    let waits: [&[&str]; 2] = [&[], &["--wait", "1m"]];
    for wait in waits {
        for sub in ["run", "acquire"] {
            let mut cmd = redlock(sub, &cluster);
            cmd.args(wait).arg("guarded");
            if sub == "run" {
                cmd.arg("true");
            }
            let start = Instant::now();
            let out = output(&mut cmd);
            let stderr = text(&out.stderr);
            assert_eq!(code(&out), 77, "{sub} {wait:?}: {stderr}");
            assert!(
                stderr.contains("refuse this client") && stderr.contains("refused authentication"),
                "{sub} {wait:?}: {stderr}"
            );
            assert!(!stderr.contains("s3cret"), "{stderr}");
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{sub} {wait:?}: took {:?}",
                start.elapsed()
            );
        }
    }

    let five = common::cluster(5);
    require_a_password(five.node(4));
    let out = output(redlock("run", &five).args(["one-bad", "--", "echo", "ran"]));
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert_eq!(text(&out.stdout), "ran\n");
    assert!(
        stderr.contains("refused authentication")
            && stderr.contains("going on with the other nodes"),
        "{stderr}"
    );
    let out = output(redlock("acquire", &five).arg("one-bad"));
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 0, "{stderr}");
    assert!(stderr.contains("going on with the other nodes"), "{stderr}");
}

/// The pieces of a message between its stops (`. `, `; `, `: `,
/// brackets, line ends), of 12 characters or more: those that repeat a
/// fact if they appear twice.
fn sentences(message: &str) -> Vec<String> {
    let mut text = message.to_string();
    for stop in [". ", "; ", ": ", " (", ")", "\n"] {
        text = text.replace(stop, "|");
    }
    text.split('|')
        .map(str::trim)
        .filter(|piece| piece.len() >= 12)
        .map(str::to_string)
        .collect()
}

/// Fails unless `message` says each piece once, names each node of
/// `nodes` once, and is under 200 characters.
fn said_once(what: &str, message: &str, nodes: &[String]) {
    assert!(
        message.len() < 200,
        "{what}: {} characters: {message}",
        message.len()
    );
    let pieces = sentences(message);
    for piece in &pieces {
        let times = pieces.iter().filter(|p| *p == piece).count();
        assert_eq!(times, 1, "{what}: {piece:?} said {times} times: {message}");
    }
    for node in nodes {
        let host = node.trim_start_matches("redis://");
        let host = host.rsplit('@').next().unwrap();
        assert_eq!(
            message.matches(host).count(),
            1,
            "{what}: {host}: {message}"
        );
    }
}

#[test]
fn a_refused_password_and_an_unknown_status_say_each_fact_once_in_under_200_characters() {
    let token = "0123456789abcdef0123456789abcdef01234567";
    for n in [1, 3] {
        let cluster = cluster(n);
        for node in cluster.nodes() {
            require_a_password(node);
        }
        let missing = cluster.urls();
        let wrong: Vec<String> = missing
            .iter()
            .map(|url| url.replace("redis://", "redis://:wrong@"))
            .collect();
        for (password, urls) in [("missing", &missing), ("wrong", &wrong)] {
            let steps: [&[&str]; 4] = [
                &["run", "r", "true"],
                &["acquire", "r"],
                &["extend", "r", token],
                &["release", "r", token],
            ];
            for step in steps {
                let (sub, rest) = step.split_first().unwrap();
                let out = output(
                    bare()
                        .arg(sub)
                        .arg("--nodes")
                        .arg(urls.join(","))
                        .args(rest),
                );
                let stderr = text(&out.stderr);
                assert_eq!(code(&out), 77, "{sub}: {stderr}");
                let what = format!("{sub}, {n} node(s), {password} password");
                said_once(&what, stderr.trim_end(), urls);
            }
        }

        // Too few nodes for status: said once, on standard output; with
        // --json, on standard error, once.
        let out = output(redlock("status", &cluster).arg("r"));
        assert_eq!(code(&out), 69, "{}", text(&out.stderr));
        assert_eq!(text(&out.stderr), "", "said on standard output already");
        let shown = text(&out.stdout);
        assert_eq!(shown.matches("fewer than a quorum").count(), 1, "{shown}");
        // Each node's error is said once: a node whose error is the one
        // above says so.
        assert_eq!(shown.matches("asks for a password").count(), 1, "{shown}");
        assert_eq!(shown.matches("the same as above").count(), n - 1, "{shown}");
        let out = output(redlock("status", &cluster).args(["--json", "r"]));
        assert_eq!(code(&out), 69);
        let stderr = text(&out.stderr);
        said_once("status --json", stderr.trim_end(), &[]);
        assert_eq!(stderr.matches("fewer than a quorum").count(), 1, "{stderr}");
    }
}

#[test]
fn nodes_whose_host_does_not_exist_fail_at_once_with_the_refused_code() {
    // `.invalid` never resolves (RFC 2606): waiting cannot mend it.
    let nodes = "redis://a.invalid:6379,redis://b.invalid:6379,redis://c.invalid:6379";
    for sub in ["run", "acquire"] {
        let mut cmd = bare();
        cmd.arg(sub)
            .args(["--nodes", nodes, "--wait", "1m", "unknown-hosts"]);
        if sub == "run" {
            cmd.arg("true");
        }
        let start = Instant::now();
        let out = output(&mut cmd);
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 77, "{sub}: {stderr}");
        assert!(stderr.contains("a.invalid"), "{sub}: {stderr}");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{sub}: took {:?}",
            start.elapsed()
        );
    }
}
