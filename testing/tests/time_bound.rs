//! The time bound of a test binary (see the crate docs): a test that hangs
//! with its servers up ends the binary with a message that names it, and
//! leaves no server and no folder behind.
//!
//! The test runs this very binary again as a child, with a bound of one
//! second, selecting only a test that starts a cluster and then hangs.

#![cfg(target_os = "linux")]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redlock_sync_testing::{Cluster, TIMED_OUT_STATUS, TIME_BOUND_VAR};

/// Set in the child's environment: there, the hanging test hangs.
const CHILD: &str = "REDLOCK_SYNC_TESTING_HANGING_CHILD";
/// The hanging test's name, as the test harness knows it.
const HANGING_TEST: &str = "a_test_that_hangs_with_a_cluster_up";
/// How long the child may take to end, well past its bound of 1 s.
const PATIENCE: Duration = Duration::from_secs(60);

/// In the child: starts a cluster, says where its servers are, and hangs.
/// Elsewhere it returns at once.
#[test]
fn a_test_that_hangs_with_a_cluster_up() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let cluster = Cluster::start(2).expect("2 redis-server nodes");
    for node in cluster.nodes() {
        println!("server {}", node.pid().expect("a running node"));
    }
    println!("folder {}", cluster.dir().display());
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_test_that_hangs_ends_its_binary_past_the_bound_naming_it_and_leaving_no_server() {
    let scratch = std::env::temp_dir().join(format!(
        "redlock-sync-testing-time-bound-{}",
        std::process::id()
    ));
    fs::create_dir_all(&scratch).unwrap();
    let (out, err) = (scratch.join("stdout"), scratch.join("stderr"));
    // Files rather than pipes: a server that outlived the child would keep
    // a pipe open, and reading it to the end would hang this test.
    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", HANGING_TEST, "--nocapture"])
        .env(CHILD, "1")
        .env(TIME_BOUND_VAR, "1")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the hanging child still ran after {PATIENCE:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let stdout = fs::read_to_string(&out).unwrap();
    let stderr = fs::read_to_string(&err).unwrap();
    let _ = fs::remove_dir_all(&scratch);
    let said = format!("stdout:\n{stdout}\nstderr:\n{stderr}");

    assert_eq!(status.code(), Some(TIMED_OUT_STATUS), "{said}");
    assert!(
        took >= Duration::from_secs(1),
        "ended after {took:?}, before its bound"
    );
    assert!(
        stderr.contains("ran past its time bound of 1s")
            && stderr.contains("a cluster of 2 node(s) started")
            && stderr.contains(&format!("by `{HANGING_TEST}`"))
            && stderr.contains(TIME_BOUND_VAR),
        "the message names the bound, the cluster and the test: {said}"
    );
    let servers: Vec<u32> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("server "))
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(servers.len(), 2, "{said}");
    let folder = stdout
        .lines()
        .find_map(|line| line.strip_prefix("folder "))
        .map(PathBuf::from)
        .expect("the child names its cluster's folder");
    for pid in servers {
        assert!(
            !is_server_in(pid, &folder),
            "server {pid} outlived its binary"
        );
    }
    assert!(!folder.exists(), "{} outlived its binary", folder.display());
}

/// Whether `pid` still runs in `folder` (a pid reused since runs elsewhere).
/// A zombie has no working folder.
fn is_server_in(pid: u32, folder: &Path) -> bool {
    fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == *folder)
}
