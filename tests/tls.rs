//! `rediss://` nodes (feature `tls`) against real TLS-only redis-server
//! processes, with a throwaway certificate authority made by `openssl`.
//!
//! Run with `cargo test --features tls --test tls`.
#![cfg(feature = "tls")]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redlock_sync::{LockError, Redlock};

/// A redis-server that speaks only TLS; killed (by pid, as our child) on drop.
struct TlsNode {
    child: Child,
    port: u16,
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private temp dir, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl must be installed for the TLS test (Debian: apt-get install openssl)");
    assert!(status.success(), "openssl {args:?} failed");
}

/// A CA, and a certificate for 127.0.0.1 and localhost signed by it.
fn certificates(dir: &Path) {
    std::fs::write(
        dir.join("san.cnf"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n",
    )
    .unwrap();
    run(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=redlock-sync test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    run(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "node.key",
            "-out",
            "node.csr",
        ],
    );
    run(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "node.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.cnf",
            "-out",
            "node.pem",
        ],
    );
}

fn start_node(dir: &Path) -> TlsNode {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let port_arg = port.to_string();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port_arg,
            "--bind",
            "127.0.0.1",
        ])
        .args(["--tls-cert-file", "node.pem", "--tls-key-file", "node.key"])
        .args(["--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (Debian: apt-get install redis-server)");
    let node = TlsNode { child, port };
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the TLS node on port {port} did not start listening"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    node
}

#[test]
fn locks_work_over_rediss_and_valkeys_with_a_verified_certificate() {
    let dir = std::env::temp_dir().join(format!("redlock-sync-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = TempDir(dir.clone());
    certificates(&dir);
    // The client trusts our CA through rustls' usual environment variable.
    // This test binary has this one test, so no other thread reads it.
    std::env::set_var("SSL_CERT_FILE", dir.join("ca.pem"));

    let nodes: Vec<TlsNode> = (0..3).map(|_| start_node(&dir)).collect();
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("rediss://127.0.0.1:{}", n.port))
        .collect();
    let locks = Redlock::builder(&urls)
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("rediss:// URLs are accepted with the tls feature");

    let lock = locks
        .acquire("over-tls", Duration::from_secs(10))
        .expect("acquire over TLS");
    assert!(lock.report().granted() >= 2, "{}", lock.report());
    assert!(
        matches!(
            locks.try_acquire("over-tls", Duration::from_secs(10)),
            Err(LockError::Contended { .. })
        ),
        "a held lock is refused over TLS too"
    );
    locks.release(lock).expect("release over TLS");

    // valkeys:// is the same as rediss://.
    let valkeys: Vec<String> = urls
        .iter()
        .map(|u| u.replace("rediss://", "valkeys://"))
        .collect();
    let over_valkeys = Redlock::builder(&valkeys)
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("valkeys:// URLs are accepted with the tls feature");
    let lock = over_valkeys
        .try_acquire("over-tls", Duration::from_secs(10))
        .expect("acquire over valkeys://");
    over_valkeys.release(lock).expect("release over valkeys://");

    // A plain-TCP client cannot talk to these nodes: TLS is really in use.
    let plain: Vec<String> = urls
        .iter()
        .map(|u| u.replace("rediss://", "redis://"))
        .collect();
    let plain = Redlock::builder(&plain)
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(plain
        .try_acquire("over-tls", Duration::from_secs(10))
        .is_err());
}
