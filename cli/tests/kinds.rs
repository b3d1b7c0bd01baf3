//! `--shared`, `--semaphore K` and `--owner`, with the real binary against
//! real redis-server nodes: readers at once and a writer after them, K
//! holders at once and the next after a release, what `status` shows,
//! and the explicit steps with their kind (a wrong kind refused).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use redlock_sync_testing::Cluster;
use serde_json::Value;

/// How long after a release the next holder must start: well inside the
/// suite's patience, far below the waiters' 10 s retry delay.
const WAKE_BOUND: Duration = Duration::from_secs(5);

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", text(&out.stdout)))
}

/// A `redlock run` whose command marks its start (a stamp in `marks` and
/// a file of its own), waits for its gate, and stamps its end.
struct Gated {
    name: String,
    tool: Tool,
    started: PathBuf,
    gate: PathBuf,
}

impl Gated {
    /// Starts `redlock run FLAGS RESOURCE -- <the gated command>`; returns
    /// at once (see [`started`](Self::started)).
    fn spawn(cluster: &Cluster, name: &str, flags: &[&str], resource: &str) -> Gated {
        let marks = scratch(cluster, "marks");
        let started = scratch(cluster, &format!("started-{name}"));
        let gate = scratch(cluster, &format!("gate-{name}"));
        let script = format!(
            "{}; touch '{}'; while [ ! -e '{}' ]; do sleep 0.02; done; {}",
            stamp(&marks, &format!("start-{name}")),
            started.display(),
            gate.display(),
            stamp(&marks, &format!("end-{name}")),
        );
        let tool = Tool::spawn(
            redlock("run", cluster)
                .args(flags)
                .args(["--ttl", "3s", resource, "--"])
                .args(sh(&script)),
        );
        Gated {
            name: name.to_string(),
            tool,
            started,
            gate,
        }
    }

    fn started(&self) -> bool {
        self.started.exists()
    }

    fn wait_started(&self) {
        wait_until(&format!("{}'s command started", self.name), || {
            self.started()
        });
    }

    /// Lets its command end, and checks that the run exits with 0.
    fn finish(mut self) {
        std::fs::write(&self.gate, "").unwrap();
        self.tool.succeeds();
    }
}

/// The instant of the stamp labelled `label` in `marks`.
fn at(marks: &Path, label: &str) -> f64 {
    stamps(marks)
        .into_iter()
        .find(|(l, _)| l == label)
        .unwrap_or_else(|| panic!("no stamp {label:?} in {:?}", read(marks)))
        .1
}

#[test]
fn two_shared_runs_hold_at_once_and_a_plain_run_waits_until_both_ended() {
    let cluster = cluster(3);
    let marks = scratch(&cluster, "marks");
    let (mark_a, mark_b) = (scratch(&cluster, "mark-a"), scratch(&cluster, "mark-b"));
    // Each reader marks, then waits (at most 15 s) until both marks exist:
    // it ends with 0 only if the other held the lock at the same time.
    let reader = |mine: &Path, name: &str| {
        let script = format!(
            "touch '{mine}'; i=0; while [ ! -e '{a}' ] || [ ! -e '{b}' ]; do \
             i=$((i+1)); [ $i -gt 750 ] && exit 3; sleep 0.02; done; {end}",
            mine = mine.display(),
            a = mark_a.display(),
            b = mark_b.display(),
            end = stamp(&marks, &format!("end-{name}")),
        );
        Tool::spawn(
            redlock("run", &cluster)
                .args(["--shared", "--ttl", "3s", "catalog", "--"])
                .args(sh(&script)),
        )
    };
    let (mut a, mut b) = (reader(&mark_a, "a"), reader(&mark_b, "b"));
    wait_until("both readers hold the lock", || {
        mark_a.exists() && mark_b.exists()
    });
    a.succeeds();
    b.succeeds();
    assert_eq!(stamps(&marks).len(), 2, "{}", read(&marks));

    // Two readers hold again; a writer waits until both are gone.
    let first = Gated::spawn(&cluster, "r1", &["--shared"], "catalog");
    let second = Gated::spawn(&cluster, "r2", &["--shared"], "catalog");
    first.wait_started();
    second.wait_started();
    let mut writer = Gated::spawn(&cluster, "w", &["-v", "--retry-delay", "50ms"], "catalog");
    writer.tool.wait_for_stderr("waiting for `catalog`");
    // Its intent, once marked, keeps new readers out.
    wait_until("the writer marked its intent", || {
        exists_on(&cluster, &redlock_sync::intents_key("catalog")) >= 2
    });
    let late = output(redlock("acquire", &cluster).args(["-n", "--shared", "catalog"]));
    assert_eq!(code(&late), 75, "{}", text(&late.stderr));
    first.finish();
    // One reader still holds: the writer still waits.
    assert_eq!(members_on(&cluster, "catalog"), [1, 1, 1]);
    assert!(!writer.started(), "the writer ran beside a reader");
    second.finish();
    writer.wait_started();
    assert!(at(&marks, "start-w") >= at(&marks, "end-r2"));
    assert!(at(&marks, "start-w") >= at(&marks, "end-r1"));
    writer.finish();
    assert_eq!(members_on(&cluster, "catalog"), [0, 0, 0]);
    assert_eq!(keys_on(&cluster, "catalog"), 0, "the lock is released");
}

#[test]
fn a_semaphore_of_two_runs_two_at_once_and_the_next_one_after_a_release() {
    let cluster = cluster(3);
    let marks = scratch(&cluster, "marks");
    // A retry delay far above the bound: only the news of a release can
    // start a waiter in time.
    let flags = ["-v", "--semaphore", "2", "--retry-delay", "10s"];
    let mut holding = vec![
        Gated::spawn(&cluster, "h0", &flags, "export"),
        Gated::spawn(&cluster, "h1", &flags, "export"),
    ];
    for holder in &holding {
        holder.wait_started();
    }
    let mut delays = Vec::new();
    for round in 2..7 {
        let mut next = Gated::spawn(&cluster, &format!("h{round}"), &flags, "export");
        next.tool.wait_for_stderr("waiting for `export`");
        wait_until("the waiter listens for a release", || {
            listeners(&cluster, "export") >= 1
        });
        assert!(!next.started(), "a third holder while two held");
        assert_eq!(members_on(&cluster, "export"), [2, 2, 2]);
        let done = holding.remove(0);
        let ended = format!("end-{}", done.name);
        done.finish();
        next.wait_started();
        let delay = at(&marks, &format!("start-h{round}")) - at(&marks, &ended);
        assert!(
            delay < WAKE_BOUND.as_secs_f64(),
            "round {round}: the waiter started {delay:.3} s after the release"
        );
        delays.push(delay);
        holding.push(next);
    }
    delays.sort_by(f64::total_cmp);
    println!(
        "a waiter started {:.1} ms (median of {}) after a holder's command ended",
        delays[delays.len() / 2] * 1000.0,
        delays.len()
    );
    for holder in holding {
        holder.finish();
    }
    assert_eq!(members_on(&cluster, "export"), [0, 0, 0]);
}

#[test]
fn status_shows_the_owner_of_a_plain_lock_and_the_holders_of_shared_and_semaphore_locks() {
    let cluster = cluster(3);
    let status = |resource: &str| {
        let out = output(redlock("status", &cluster).args(["--json", resource]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let shown = text(&output(redlock("status", &cluster).arg(resource)).stdout);
        (json(&out), shown)
    };

    // The default owner: the host's name and the pid of the process that
    // called `redlock acquire`, this test.
    let printed = scratch(&cluster, "token");
    let mut acquire = Tool::spawn(
        redlock("acquire", &cluster)
            .arg("deploy")
            .stdout(std::fs::File::create(&printed).unwrap()),
    );
    let owner = format!("{}:{}", host_name(), std::process::id());
    acquire.succeeds();
    let (seen, shown) = status("deploy");
    assert_eq!(seen["kind"], "exclusive", "{seen}");
    assert_eq!(seen["owner"], owner.as_str(), "{seen}");
    assert_eq!(seen["token_prefix"], read(&printed)[..8]);
    for node in seen["nodes"].as_array().unwrap() {
        assert_eq!(node["owner"], owner.as_str(), "{node}");
        assert_eq!(node["holders"][0]["owner"], owner.as_str(), "{node}");
    }
    assert!(
        shown.starts_with(&format!(
            "`deploy`: held, token {}..., owner {owner}, on 3 of 3",
            &read(&printed)[..8]
        )),
        "{shown}"
    );
    assert_eq!(shown.matches(&format!(", {owner})")).count(), 3, "{shown}");

    for owner in ["reader-1", "reader-2"] {
        let out =
            output(redlock("acquire", &cluster).args(["--shared", "--owner", owner, "catalog"]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    }
    let (seen, shown) = status("catalog");
    assert_eq!(seen["held"], true);
    assert_eq!(seen["kind"], "shared");
    assert_eq!(seen["token_prefix"], Value::Null);
    let mut owners: Vec<&str> = (seen["holders"].as_array().unwrap().iter())
        .map(|h| h["owner"].as_str().unwrap())
        .collect();
    owners.sort_unstable();
    assert_eq!(owners, ["reader-1", "reader-2"], "{seen}");
    for holder in seen["holders"].as_array().unwrap() {
        assert_eq!(holder["nodes"], 3, "{holder}");
        assert!(holder["ttl_ms"].as_u64().unwrap() > 10_000, "{holder}");
    }
    assert_eq!(
        seen["nodes"][0]["holders"].as_array().map(Vec::len),
        Some(2)
    );
    assert!(
        shown.starts_with("`catalog`: shared by 2 reader(s)"),
        "{shown}"
    );
    assert!(
        shown.contains("owner reader-1") && shown.contains("owner reader-2"),
        "{shown}"
    );

    for owner in ["export-1", "export-2"] {
        let out = output(redlock("acquire", &cluster).args([
            "--semaphore",
            "3",
            "--owner",
            owner,
            "export",
        ]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    }
    let (seen, shown) = status("export");
    assert_eq!(seen["kind"], "semaphore");
    assert_eq!(seen["permits"], 3);
    assert_eq!(seen["permits_left"], 1);
    assert_eq!(seen["holders"].as_array().map(Vec::len), Some(2), "{seen}");
    assert_eq!(seen["nodes"][2]["permits"], 3);
    assert!(
        shown.starts_with("`export`: semaphore of 3 permits, 2 held, 1 left"),
        "{shown}"
    );
    assert!(shown.contains("owner export-2"), "{shown}");
    assert!(shown.contains("semaphore of 3: "), "{shown}");
}

#[test]
fn a_runs_owner_is_its_host_and_pid_and_status_shows_it_while_the_command_runs() {
    let cluster = cluster(3);
    for flags in [&[][..], &["--shared"], &["--semaphore", "2"]] {
        let run = Gated::spawn(&cluster, "run", flags, "job");
        run.wait_started();
        let owner = format!("{}:{}", host_name(), run.tool.pid());
        let out = output(redlock("status", &cluster).args(["--json", "job"]));
        let seen = json(&out);
        assert_eq!(
            seen["holders"][0]["owner"],
            owner.as_str(),
            "{flags:?}: {seen}"
        );
        run.finish();
        for f in ["started-run", "gate-run", "marks"] {
            std::fs::remove_file(scratch(&cluster, f)).unwrap();
        }
    }
}

#[test]
fn acquires_default_owner_is_the_shell_that_called_it_not_the_redlock_process_that_exited() {
    let cluster = cluster(3);
    let binary = env!("CARGO_BIN_EXE_redlock");
    let nodes = cluster.urls().join(",");
    // The shell prints its pid, then the owner that acquire reports; the
    // last `true` keeps the shell from replacing itself with redlock.
    let script = format!(
        "echo $$; '{binary}' acquire --json --io-timeout 2s --connect-timeout 2s \
         --nodes '{nodes}' handoff; true"
    );
    let out = output(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .env_remove("REDLOCK_NODES"),
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let (shell, acquired) = printed.split_once('\n').expect("two lines");
    let acquired: Value = serde_json::from_str(acquired).expect("a JSON object");
    let owner = format!("{}:{}", host_name(), shell.trim());
    assert_eq!(acquired["owner"], owner.as_str(), "{printed}");
    let out = output(redlock("status", &cluster).args(["--json", "handoff"]));
    assert_eq!(json(&out)["owner"], owner.as_str());
}

#[test]
fn status_of_an_applications_hash_says_held_by_something_that_is_not_a_lock_and_exits_0() {
    let cluster = cluster(3);
    for node in cluster.nodes() {
        node.query(&["HSET", "settings", "theme", "dark"]).unwrap();
    }
    let out = output(redlock("status", &cluster).arg("settings"));
    assert_eq!(code(&out), 0, "held: {}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.starts_with("`settings`: held by an application's hash (not a lock), on 3 of 3"),
        "{shown}"
    );
    let out = output(redlock("status", &cluster).args(["--json", "settings"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let seen = json(&out);
    assert_eq!(seen["held"], true, "{seen}");
    assert_eq!(seen["kind"], "not_a_lock", "{seen}");
    assert_eq!(seen["redis_type"], "hash", "{seen}");
    assert_eq!(seen["nodes"][0]["redis_type"], "hash", "{seen}");
}

#[test]
fn status_shows_a_waiting_writers_intent_with_its_time_left() {
    let cluster = cluster(3);
    let out = output(redlock("acquire", &cluster).args(["--shared", "report"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let reader = text(&out.stdout).trim().to_string();
    // A writer waits behind the reader, and marks its intent.
    let mut writer = Tool::spawn(
        redlock("acquire", &cluster)
            .args(["--ttl", "20s", "--retry-delay", "50ms", "report"])
            .stdout(std::process::Stdio::null()),
    );
    wait_until("status shows the writer's intent", || {
        let out = output(redlock("status", &cluster).args(["--json", "report"]));
        json(&out)["intent_ms"].is_u64()
    });
    let out = output(redlock("status", &cluster).args(["--json", "report"]));
    let left = json(&out)["intent_ms"].as_u64().unwrap();
    assert!(left > 10_000 && left <= 20_000, "{left}");
    let shown = text(&output(redlock("status", &cluster).arg("report")).stdout);
    assert!(
        shown.contains("\n  new readers held back for a waiting writer, "),
        "{shown}"
    );
    let out = output(redlock("release", &cluster).args(["--shared", "report", &reader]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    writer.succeeds();
}

#[test]
fn status_json_of_a_two_permit_semaphore_gives_its_quorum_of_4_and_the_writers_quorum_of_3() {
    let cluster = cluster(5);
    let out = output(redlock("acquire", &cluster).args(["--semaphore", "2", "export"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let out = output(redlock("status", &cluster).args(["--json", "export"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let seen = json(&out);
    assert_eq!(
        (&seen["quorum"], &seen["writer_quorum"]),
        (&4.into(), &3.into()),
        "{seen}"
    );
    assert_eq!(
        (&seen["holder_count"], &seen["permits_left"]),
        (&1.into(), &1.into()),
        "{seen}"
    );
    // A reader's quorum is the writers': no second figure.
    let out = output(redlock("acquire", &cluster).args(["--shared", "catalog"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let seen = json(&output(
        redlock("status", &cluster).args(["--json", "catalog"]),
    ));
    assert_eq!(seen["quorum"], 3, "{seen}");
    assert!(seen.get("writer_quorum").is_none(), "{seen}");
}

#[test]
fn explicit_steps_take_the_kind_and_a_wrong_kind_is_refused_with_the_usage_code() {
    let cluster = cluster(3);
    let step = |args: &[&str]| {
        let (sub, rest) = args.split_first().unwrap();
        output(redlock(sub, &cluster).args(rest))
    };
    let token = |out: &std::process::Output| {
        assert_eq!(code(out), 0, "{}", text(&out.stderr));
        let token = text(&out.stdout).trim().to_string();
        assert_eq!(token.len(), 40, "the token alone: {token:?}");
        token
    };

    // Readers: two at once; a writer is refused; a release must name the kind.
    let (r1, r2) = (
        token(&step(&["acquire", "--shared", "catalog"])),
        token(&step(&["acquire", "--shared", "catalog"])),
    );
    assert_eq!(code(&step(&["acquire", "-n", "catalog"])), 75);
    for wrong in [&[][..], &["--semaphore", "2"]] {
        let args = [&["release", "--json"][..], wrong, &["catalog", r1.as_str()]].concat();
        let out = step(&args);
        assert_eq!(code(&out), 64, "{wrong:?}: {}", text(&out.stderr));
        assert_eq!(json(&out)["error"], "wrong_kind");
        assert!(
            text(&out.stderr).contains("held as a shared lock"),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        members_on(&cluster, "catalog"),
        [2, 2, 2],
        "nothing released"
    );
    let out = step(&["extend", "--shared", "--ttl", "60s", "catalog", &r1]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(cluster.node(0).pttl("catalog").unwrap() > 50_000);
    for t in [&r1, &r2] {
        let out = step(&["release", "--shared", "catalog", t]);
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    }
    assert_eq!(members_on(&cluster, "catalog"), [0, 0, 0]);
    assert_eq!(code(&step(&["release", "--shared", "catalog", &r1])), 76);

    // A semaphore of 2: a third is refused; another K or kind is a usage error.
    let out = step(&["acquire", "--json", "--semaphore", "2", "export"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let acquired = json(&out);
    assert_eq!(
        (acquired["kind"].as_str(), acquired["permits"].as_u64()),
        (Some("semaphore"), Some(2))
    );
    assert_eq!(acquired["fencing_token"], Value::Null);
    assert!(acquired["owner"]
        .as_str()
        .unwrap()
        .starts_with(&format!("{}:", host_name())));
    let s1 = acquired["token"].as_str().unwrap().to_string();
    let s2 = token(&step(&["acquire", "--semaphore", "2", "export"]));
    assert_eq!(
        code(&step(&["acquire", "-n", "--semaphore", "2", "export"])),
        75
    );
    let ran = scratch(&cluster, "ran");
    let touch = ["touch".to_string(), ran.display().to_string()];
    for wrong in [
        &["acquire", "-n", "--semaphore", "3", "export"][..],
        &["acquire", "--shared", "export"],
        &["release", "--semaphore", "3", "export", s1.as_str()],
    ] {
        let out = step(wrong);
        assert_eq!(code(&out), 64, "{wrong:?}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("held as a semaphore of 2 permits"),
            "{wrong:?}: {}",
            text(&out.stderr)
        );
    }
    let out = output(
        redlock("run", &cluster)
            .args(["--semaphore", "3", "export", "--"])
            .args(&touch),
    );
    assert_eq!(code(&out), 64, "{}", text(&out.stderr));
    assert!(!ran.exists(), "the command ran under a wrong kind");
    for t in [&s1, &s2] {
        assert_eq!(
            code(&step(&["release", "--semaphore", "2", "export", t])),
            0
        );
    }
    assert_eq!(members_on(&cluster, "export"), [0, 0, 0]);

    // A plain lock is not released, nor extended, as a shared one; a
    // shared one is not extended as a plain one: the user's flags are wrong.
    let p = token(&step(&["acquire", "deploy"]));
    let r = token(&step(&["acquire", "--shared", "catalog"]));
    for (wrong, resource, t) in [
        (&["--shared"][..], "deploy", &p),
        (&["--semaphore", "2"], "deploy", &p),
        (&[], "catalog", &r),
    ] {
        let args = [&["extend"][..], wrong, &[resource, t.as_str()]].concat();
        let out = step(&args);
        assert_eq!(code(&out), 64, "{args:?}: {}", text(&out.stderr));
    }
    assert_eq!(code(&step(&["release", "--shared", "catalog", &r])), 0);
    let out = step(&["release", "--shared", "deploy", &p]);
    assert_eq!(code(&out), 64, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("held as a plain or fenced lock"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(holders(&cluster, "deploy", &p), 3, "nothing released");
    assert_eq!(code(&step(&["release", "--fenced", "deploy", &p])), 0);
    assert_eq!(keys_on(&cluster, "deploy"), 0);
}

#[test]
fn kind_flags_exclude_each_other_and_bad_kinds_or_owners_are_usage_errors() {
    let unused = "redis://127.0.0.1:1";
    let token = "0123456789abcdef0123456789abcdef01234567";
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--shared", "--semaphore", "2", "r", "true"],
            "cannot be used with",
        ),
        (
            &["run", "--fenced", "--shared", "r", "true"],
            "cannot be used with",
        ),
        (
            &["acquire", "--fenced", "--semaphore", "2", "r"],
            "cannot be used with",
        ),
        (
            &["release", "--shared", "--semaphore", "2", "r", token],
            "cannot be used with",
        ),
        (
            &["acquire", "--semaphore", "0", "r"],
            "a semaphore needs at least 1 permit",
        ),
        (
            &["run", "--semaphore", "many", "r", "true"],
            "--semaphore <K>",
        ),
        (&["acquire", "--owner", "", "r"], "owner label"),
        (&["run", "--owner", "a\tb", "r", "true"], "owner label"),
    ];
    for (args, says) in cases {
        let (sub, rest) = args.split_first().unwrap();
        let out = output(bare().args([*sub, "--nodes", unused]).args(rest));
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 64, "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?} should say {says:?}: {stderr}"
        );
    }
}

#[test]
fn the_help_and_the_manual_page_tell_the_kinds_and_the_owner() {
    let help =
        |args: &[&str]| text(&output(bare().args(args)).stdout).replace(char::is_whitespace, " ");
    for sub in ["run", "acquire", "extend", "release"] {
        let shown = help(&[sub, "--help"]);
        for says in ["--shared", "--semaphore <K>", "held as another kind"] {
            assert!(
                shown.contains(says),
                "{sub} --help should say {says:?}: {shown}"
            );
        }
    }
    assert!(help(&["run", "--help"]).contains("like flock -s"));
    // A kind the user got wrong is a usage error for extend as for the
    // rest; 76 is for a lock that was lost.
    let extend = help(&["extend", "--help"]);
    let codes = extend.split_once("Exit codes:").unwrap().1;
    let usage = codes.split_once(" 69 ").unwrap().0;
    assert!(usage.contains("held as another kind"), "{extend}");
    let lost = codes.split_once(" 76 ").unwrap().1;
    assert!(!lost.contains("kind"), "{extend}");
    assert!(help(&["acquire", "--help"]).contains("--owner <LABEL>"));
    assert!(help(&["status", "--help"]).contains("owner label"));
    let page = text(&output(bare().args(["man", "run"])).stdout);
    for says in ["shared", "semaphore", "owner"] {
        assert!(page.contains(says), "the manual page should say {says:?}");
    }
}

#[test]
fn a_permit_whose_nodes_went_to_readers_is_lost_at_extend_and_release_with_76() {
    let cluster = cluster(5);
    let step = |args: &[&str]| {
        let (sub, rest) = args.split_first().unwrap();
        output(redlock(sub, &cluster).args(rest))
    };
    let out = step(&["acquire", "--semaphore", "2", "--ttl", "30s", "printer"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let permit = text(&out.stdout).trim().to_string();
    // Its member gone from four nodes (a flush of that key), and readers
    // take the resource there.
    for node in &cluster.nodes()[..4] {
        node.query(&["DEL", "printer"]).unwrap();
    }
    let reader = step(&["acquire", "--shared", "--ttl", "30s", "printer"]);
    assert_eq!(code(&reader), 0, "{}", text(&reader.stderr));
    for sub in ["extend", "release"] {
        let out = step(&[sub, "--semaphore", "2", "printer", &permit]);
        assert_eq!(code(&out), 76, "{sub}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("lost"), "{}", text(&out.stderr));
    }
}
