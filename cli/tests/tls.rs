//! `redlock` over `rediss://` nodes (feature `tls`): the real binary
//! against real TLS-only redis-server nodes, trusting their throwaway
//! certificate authority through `SSL_CERT_FILE`.
//!
//! Run with `cargo test -p redlock-cli --features tls --test tls`.
//! Without the feature this test binary is empty.

#![cfg(feature = "tls")]

mod common;

use common::*;
use redlock_sync_testing::Cluster;

#[test]
fn acquire_status_run_and_release_over_tls() {
    let cluster = Cluster::start_tls(3)
        .unwrap_or_else(|e| panic!("cannot start 3 TLS redis-server nodes: {e}"));
    let ca = cluster.ca_file().expect("a TLS cluster has a CA");
    // `redlock` gives roomy timeouts: a TLS handshake of a debug build on
    // a busy 2-core machine can take longer than the default 50 ms.
    let tool = |subcommand: &str| {
        let mut cmd = redlock(subcommand, &cluster);
        cmd.env("SSL_CERT_FILE", &ca);
        cmd
    };

    let out = output(tool("acquire").args(["--ttl", "10s", "deploy"]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let token = text(&out.stdout).trim().to_string();
    assert_eq!(token.len(), 40, "the token alone on stdout: {token:?}");
    // The harness inspects over the nodes' plain ports.
    let holders = holders(&cluster, "deploy", &token);
    assert!(holders >= 2, "a quorum holds the token: {holders} of 3");

    // status reads every node over TLS too.
    let out = output(tool("status").arg("deploy"));
    assert_eq!(code(&out), 0, "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("`deploy`: held"),
        "{}",
        text(&out.stdout)
    );

    let out = output(tool("release").args(["deploy", &token]));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(cluster.node(0).get("deploy").unwrap(), None);

    #[cfg(unix)]
    {
        let out = output(tool("run").args(["deploy", "--", "sh", "-c", "exit 3"]));
        assert_eq!(
            code(&out),
            3,
            "run passes the command's status: {}",
            text(&out.stderr)
        );
    }

    // Without the CA, the nodes' certificate is not trusted: every node
    // refuses this client, which waiting cannot fix (77), even with a wait.
    let out = output(
        tool("acquire")
            .env_remove("SSL_CERT_FILE")
            .args(["--wait", "1m", "x"]),
    );
    assert_eq!(code(&out), 77, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("certificate"),
        "{}",
        text(&out.stderr)
    );
}
