//! `redlock acquire`, `extend`, `release` and `status` across invocations,
//! and bad input, with the real binary against real redis-server nodes.

mod common;

use common::*;
use serde_json::Value;

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", text(&out.stdout)))
}

#[test]
fn acquire_and_release_in_separate_invocations_with_status_before_and_after() {
    let cluster = cluster(3);

    let out = output(redlock("status", &cluster).arg("deploy"));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("`deploy`: not held"),
        "{}",
        text(&out.stdout)
    );

    // The nodes may come from the environment too.
    let out = output(
        bare()
            .env("REDLOCK_NODES", cluster.urls().join(","))
            .args(["acquire", "--ttl", "10s", "deploy"]),
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let token = text(&out.stdout).trim().to_string();
    assert_eq!(token.len(), 40, "the token alone on stdout: {token:?}");
    assert_eq!(holders(&cluster, "deploy", &token), 3);

    let out = output(redlock("status", &cluster).args(["--json", "deploy"]));
    assert_eq!(code(&out), 0);
    let status = json(&out);
    assert_eq!(status["held"], true);
    assert_eq!(status["token_prefix"], token[..8]);
    assert_eq!(status["answered"], 3);
    for node in status["nodes"].as_array().unwrap() {
        assert_eq!(node["state"], "held");
        assert!(node["ttl_ms"].as_u64().unwrap() > 5_000, "{node}");
    }
    let out = output(redlock("status", &cluster).arg("deploy"));
    let shown = text(&out.stdout);
    assert!(shown.starts_with("`deploy`: held"), "{shown}");
    assert!(
        !shown.contains(&token),
        "status never shows a whole token: {shown}"
    );

    let out = output(redlock("acquire", &cluster).args(["-n", "deploy"]));
    assert_eq!(code(&out), 75, "held: another acquire is refused");

    let out =
        output(redlock("extend", &cluster).args(["--ttl", "60s", "--json", "deploy", &token]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(json(&out)["validity_ms"].as_f64().unwrap() > 50_000.0);
    assert!(cluster.node(0).pttl("deploy").unwrap() > 50_000);

    let out = output(redlock("release", &cluster).args(["deploy", &token]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    assert_eq!(keys_on(&cluster, "deploy"), 0);

    let out = output(redlock("status", &cluster).args(["--json", "deploy"]));
    assert_eq!(json(&out)["held"], false);

    // Given back already: releasing or extending again says it was lost.
    let out = output(redlock("release", &cluster).args(["deploy", &token]));
    assert_eq!(code(&out), 76, "{}", text(&out.stderr));
    let out = output(redlock("extend", &cluster).args(["deploy", &token]));
    assert_eq!(code(&out), 76, "{}", text(&out.stderr));
}

#[test]
fn a_fenced_acquire_prints_the_token_and_a_growing_fencing_token() {
    let cluster = cluster(3);
    let mut last = 0;
    for _ in 0..2 {
        let out = output(redlock("acquire", &cluster).args(["--fenced", "--json", "ledger"]));
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let acquired = json(&out);
        let token = acquired["token"].as_str().unwrap().to_string();
        let fencing = acquired["fencing_token"].as_u64().expect("a fencing token");
        assert!(fencing > last, "{fencing} after {last}");
        last = fencing;

        let out = output(redlock("status", &cluster).arg("ledger"));
        assert!(
            text(&out.stdout).contains(&format!("fence {fencing}")),
            "{}",
            text(&out.stdout)
        );
        let out = output(redlock("release", &cluster).args(["ledger", &token]));
        assert_eq!(code(&out), 0);
    }
    let out = output(redlock("acquire", &cluster).args(["--fenced", "ledger"]));
    let printed = text(&out.stdout);
    let fields: Vec<&str> = printed.split_whitespace().collect();
    assert_eq!(fields.len(), 2, "token and fencing token: {printed:?}");
    assert!(fields[1].parse::<u64>().unwrap() > last);
}

#[test]
fn status_says_which_nodes_failed_and_when_too_few_answered() {
    let cluster = cluster(3);
    cluster.node(0).kill().unwrap();
    let out = output(redlock("status", &cluster).arg("r"));
    assert_eq!(
        code(&out),
        0,
        "two of three answered: {}",
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout).matches("error: ").count(),
        1,
        "{}",
        text(&out.stdout)
    );

    // One of three answered, with no key: the two silent nodes may hold
    // a token, so whether the lock is held cannot be told.
    cluster.node(1).kill().unwrap();
    let out = output(redlock("status", &cluster).args(["--json", "r"]));
    assert_eq!(code(&out), 69, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("fewer than a quorum"));
    let status = json(&out);
    assert_eq!(status["held"], Value::Null, "{status}");
    assert_eq!(status["answered"], 1);
    assert_eq!(status["nodes"][0]["state"], "error");
    assert_eq!(status["nodes"][2]["state"], "free");
    let out = output(redlock("status", &cluster).arg("r"));
    assert_eq!(code(&out), 69, "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.starts_with("`r`: unknown (only 1 of 3 nodes answered, fewer than a quorum of 2)"),
        "{shown}"
    );
    assert!(!shown.contains("not held"), "{shown}");

    let out = output(redlock("acquire", &cluster).args(["-n", "--json", "r"]));
    assert_eq!(
        code(&out),
        69,
        "no quorum: the nodes code, not the conflict code"
    );
    let failure = json(&out);
    assert_eq!(failure["error"], "no_quorum");
    assert_eq!(failure["nodes"][0]["outcome"], "failed");
    assert!(text(&out.stderr).contains(&format!("127.0.0.1:{}", cluster.node(0).port().unwrap())));
}

#[test]
fn a_wait_without_a_limit_says_when_too_few_nodes_answer_and_takes_the_lock_once_they_are_back() {
    let cluster = cluster(3);
    cluster.node(0).kill().unwrap();
    cluster.node(1).kill().unwrap();
    let printed = scratch(&cluster, "stdout");
    let mut tool = Tool::spawn(
        redlock("acquire", &cluster)
            .args(["--json", "--retry-delay", "50ms", "back"])
            .stdout(std::fs::File::create(&printed).unwrap()),
    );
    // Said without --verbose: a wait with no limit must not look like a
    // hang. The message names a failed node.
    tool.wait_for_stderr("too few nodes answered");
    let said = tool.stderr.last().unwrap().clone();
    assert!(said.starts_with("redlock: waiting for `back`: "), "{said}");
    let down = format!("127.0.0.1:{}", cluster.node(0).port().unwrap());
    assert!(said.contains(&down), "{said}");
    assert!(!tool.has_ended(), "it keeps waiting: {said}");

    cluster.node(0).start().unwrap();
    cluster.node(1).start().unwrap();
    let status = tool.wait(PATIENCE);
    assert_eq!(status.code(), Some(0), "{}", tool.stderr_text());
    // stdout is still the one JSON object: the waiting went to stderr.
    let out = read(&printed);
    let acquired: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON object ({e}): {out}"));
    let token = acquired["token"].as_str().expect("a token");
    assert!(holders(&cluster, "back", token) >= 2);
}

#[test]
fn a_pause_too_long_for_the_clock_is_no_panic_and_a_signal_still_ends_the_wait() {
    // Far past what an `Instant` can hold: no deadline, no panic.
    let forever = "500000000000y";
    let mut tool = Tool::spawn(bare().args([
        "acquire",
        "--nodes",
        "redis://:s3cret@127.0.0.1:1",
        "--retry-delay",
        forever,
        "--wait",
        forever,
        "r",
    ]));
    // Said before the pause: the signal comes after it, or during it.
    tool.wait_for_stderr("too few nodes answered");
    tool.signal("TERM");
    let status = tool.wait(PATIENCE);
    let stderr = tool.stderr_text();
    assert_eq!(status.code(), Some(128 + 15), "{stderr}");
    assert!(
        stderr.contains("stopped by signal 15 while waiting for `r`"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !stderr.contains("s3cret"),
        "a password was printed: {stderr}"
    );
}

#[test]
fn bad_input_gets_a_clear_message_and_the_usage_exit_code() {
    let unused = "redis://127.0.0.1:1";
    let forever = "500000000000y";
    let token = "0123456789abcdef0123456789abcdef01234567";
    let cases: &[(&[&str], &str)] = &[
        (&["status", "r"], "no nodes"),
        (&["acquire", "--nodes", "", "r"], "no nodes"),
        (&["acquire", "--nodes", "http://h:1", "r"], "not usable"),
        (
            &[
                "release",
                "--nodes",
                "redis://:s3cret@127.0.0.1:1,redis://:s3cret@127.0.0.1:1",
                "r",
                token,
            ],
            "listed twice",
        ),
        (
            &["run", "--nodes", unused, "--ttl", "5 parsecs", "r", "true"],
            "such as 500ms",
        ),
        (
            &["run", "--nodes", unused, "--wait=-1s", "r", "true"],
            "invalid value '-1s' for '--wait <DURATION>'",
        ),
        (&["run", "--nodes", unused, "r"], "<COMMAND>"),
        (
            &["run", "--nodes", unused, "-n", "--wait", "1s", "r", "true"],
            "cannot be used with",
        ),
        (
            &["release", "--nodes", unused, "r", "not-a-token"],
            "bad token",
        ),
        (
            &["extend", "--nodes", unused, "r", &token[1..]],
            "bad token",
        ),
        (&["acquire", "--nodes", unused, ""], "empty"),
        (&["acquire", "--nodes", unused, "--ttl", "0s", "r"], "TTL"),
        // Durations too long for the clock are a message, not a panic.
        (
            &["acquire", "--nodes", unused, "--ttl", forever, "r"],
            "TTL",
        ),
        (
            &[
                "run",
                "--nodes",
                unused,
                "--io-timeout",
                forever,
                "r",
                "true",
            ],
            "at most",
        ),
        (
            &[
                "status",
                "--nodes",
                unused,
                "--connect-timeout",
                forever,
                "r",
            ],
            "at most",
        ),
        (&["status", "--nodes", unused, ""], "empty"),
        (&["run", "--nodes", unused, "-E", "300", "r", "true"], "300"),
        (&["lock", "r"], "unrecognized subcommand"),
        (&[], "Usage"),
    ];
    for (args, says) in cases {
        let out = output(bare().args(*args));
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 64, "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?} should say {says:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("s3cret"),
            "{args:?} printed a password: {stderr}"
        );
    }

    // TLS nodes need the tool's `tls` feature; without it, it says how to
    // get it (with it, tests/tls.rs runs them).
    if !cfg!(feature = "tls") {
        for url in ["rediss://:s3cret@127.0.0.1:1", "VALKEYS://127.0.0.1:1"] {
            let out = output(bare().args(["acquire", "--nodes", url, "r"]));
            let stderr = text(&out.stderr);
            assert_eq!(code(&out), 64, "{url}: {stderr}");
            assert!(stderr.contains("--features tls"), "{url}: {stderr}");
            assert!(!stderr.contains("s3cret"), "{url}: {stderr}");
        }
    }

    // With --json, the error is an object on stdout as well.
    let out = output(bare().args(["acquire", "--json", "--ttl", "soon", "r"]));
    assert_eq!(code(&out), 64);
    assert_eq!(json(&out)["error"], "usage");
    let out = output(bare().args(["status", "--json", "r"]));
    assert_eq!(code(&out), 64);
    assert_eq!(json(&out)["error"], "usage");

    // Help is not an error.
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["help", "status"],
        &["--version"],
    ] {
        let out = output(bare().args(args));
        assert_eq!(code(&out), 0, "{args:?}");
    }
    let help = text(&output(bare().args(["run", "--help"])).stdout);
    for says in ["Exit codes", "75", "76", "128+N", "Example"] {
        assert!(help.contains(says), "run --help should say {says:?}");
    }
}

/// The exit codes that a help text lists under "Exit codes", in its order:
/// the first word of each line that starts with two blanks.
fn listed_codes(help: &str) -> Vec<String> {
    let Some((_, block)) = help.split_once("Exit codes") else {
        return Vec::new();
    };
    let block = block.split("\n\n").next().unwrap_or_default();
    block
        .lines()
        .skip(1)
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Where an exit code sorts: `any` first, `128+N` after 128.
fn code_rank(code: &str) -> u32 {
    match code {
        "any" => 0,
        "128+N" => 128,
        n => n
            .parse()
            .unwrap_or_else(|_| panic!("not an exit code: {n}")),
    }
}

#[test]
fn every_help_lists_each_exit_code_once_in_ascending_order() {
    let subcommands = [
        "",
        "run",
        "acquire",
        "extend",
        "release",
        "status",
        "man",
        "completions",
    ];
    for sub in subcommands {
        let args: Vec<&str> = [sub, "--help"]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let out = output(bare().args(&args));
        assert_eq!(code(&out), 0, "{args:?}");
        let help = text(&out.stdout);
        let codes = listed_codes(&help);
        assert!(codes.len() >= 3, "{args:?}: too few codes in {help}");
        let ranks: Vec<u32> = codes.iter().map(|c| code_rank(c)).collect();
        assert!(
            ranks.windows(2).all(|pair| pair[0] < pair[1]),
            "{args:?}: codes {codes:?} not once each in ascending order"
        );
    }
}

#[test]
fn a_ttl_under_3_ms_is_refused_in_the_tools_words_and_the_library_takes_3_ms() {
    let cluster = cluster(1);
    for ttl in ["0", "0s", "2ms", "2999us"] {
        let out = output(redlock("acquire", &cluster).args(["--ttl", ttl, "r"]));
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 64, "--ttl {ttl}: {stderr}");
        assert!(stderr.contains("at least 3 ms"), "--ttl {ttl}: {stderr}");
        assert!(!stderr.contains("drift_factor"), "--ttl {ttl}: {stderr}");
    }
    // The least TTL the tool names passes the library's check: a round
    // may still outlast 3 ms on a busy machine (69), but it is no usage
    // error.
    let out = output(redlock("acquire", &cluster).args(["-n", "--ttl", "3ms", "r"]));
    let stderr = text(&out.stderr);
    assert!([0, 69].contains(&code(&out)), "{stderr}");
    assert!(!stderr.contains("invalid argument"), "{stderr}");
}

#[test]
fn a_semaphore_of_0_permits_is_refused_in_the_tools_words() {
    let out = output(
        bare()
            .args(["acquire", "--nodes", "redis://127.0.0.1:1"])
            .args(["--semaphore", "0", "r"]),
    );
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 64, "{stderr}");
    assert!(
        stderr.contains("a semaphore needs at least 1 permit"),
        "{stderr}"
    );
    assert!(!stderr.contains("4294967295"), "{stderr}");
}

#[test]
fn with_redlock_nodes_set_the_usage_line_does_not_show_nodes_as_given_and_the_variable_is_used() {
    let cluster = cluster(1);
    let out = output(
        bare()
            .env("REDLOCK_NODES", cluster.urls().join(","))
            .arg("acquire"),
    );
    let stderr = text(&out.stderr);
    assert_eq!(code(&out), 64, "{stderr}");
    let usage = stderr
        .lines()
        .find(|line| line.starts_with("Usage:"))
        .unwrap_or_else(|| panic!("no usage line: {stderr}"));
    assert!(
        !usage.contains("--nodes") || usage.contains("[--nodes"),
        "{usage}"
    );
    // The variable still gives the nodes, and --nodes comes first.
    let out = output(
        bare()
            .env("REDLOCK_NODES", cluster.urls().join(","))
            .args(["acquire", "-n", "r"]),
    );
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let out = output(
        bare()
            .env("REDLOCK_NODES", cluster.urls().join(","))
            .args(["status", "--nodes", "", "r"]),
    );
    assert_eq!(code(&out), 64, "{}", text(&out.stderr));
    let help = text(&output(bare().args(["acquire", "--help"])).stdout);
    assert!(help.contains("REDLOCK_NODES"), "{help}");
}

#[test]
fn a_subcommand_with_two_letters_swapped_gets_a_did_you_mean() {
    for (typed, meant) in [("rnu", "run"), ("stauts", "status"), ("acquier", "acquire")] {
        let out = output(bare().args([typed, "r"]));
        let stderr = text(&out.stderr);
        assert_eq!(code(&out), 64, "{typed}: {stderr}");
        assert!(
            stderr.contains(&format!("a similar subcommand exists: '{meant}'")),
            "{typed}: {stderr}"
        );
    }
    let out = output(bare().args(["lock", "r"]));
    assert!(
        !text(&out.stderr).contains("similar"),
        "{}",
        text(&out.stderr)
    );
}
