//! Starting one server process: a free port or a socket path in the
//! cluster's temporary directory, the command line, waiting until the
//! process we spawned (not a stranger on a raced port) answers `PING`, and
//! the tail of its log when it does not.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{certs, io_error, record, HarnessError};

/// How long a freshly spawned node may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Sleep between two readiness probes.
const READY_POLL: Duration = Duration::from_millis(5);
/// Connect and I/O timeout of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long `Node::start` / `Node::restart` retry when the address is
/// not free yet.
pub(super) const SAME_ADDRESS_RETRY: Duration = Duration::from_secs(2);
/// Sleep between two attempts to start on the same address.
const SAME_ADDRESS_POLL: Duration = Duration::from_millis(20);
/// How many fresh ports a TCP node tries before giving up.
const PORT_ATTEMPTS: usize = 8;
/// Lines of a node's log file quoted in [`HarnessError::NotReady`].
const LOG_TAIL_LINES: usize = 20;
/// Unix socket paths must stay below this many bytes.
pub(super) const MAX_SOCKET_PATH: usize = 100;

/// Counter that makes cluster directory names unique within this process.
static CLUSTER_COUNTER: AtomicU64 = AtomicU64::new(0);

fn random_hex() -> Result<String, HarnessError> {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).map_err(|e| {
        io_error(
            "getting random bytes for a temporary directory name",
            io::Error::other(e.to_string()),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Creates `temp_dir()/redlock-sync-<pid>-<counter>-<8 random hex>`.
pub(super) fn make_cluster_dir(unix_sockets: bool, nodes: usize) -> Result<PathBuf, HarnessError> {
    let temp = std::env::temp_dir();
    let mut base = std::path::absolute(&temp)
        .map_err(|e| io_error(format!("resolving temp dir {}", temp.display()), e))?;
    // Room for "/redlock-sync-<pid>-<counter>-<hex>/node-<i>.sock".
    let room = 64 + nodes.to_string().len();
    if unix_sockets
        && base.as_os_str().len() + room >= MAX_SOCKET_PATH
        && Path::new("/tmp").is_dir()
    {
        base = PathBuf::from("/tmp");
    }
    let mut last_error = None;
    for _ in 0..16 {
        let name = format!(
            "redlock-sync-{}-{}-{}",
            std::process::id(),
            CLUSTER_COUNTER.fetch_add(1, Ordering::Relaxed),
            random_hex()?
        );
        let dir = base.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_error = Some(e),
            Err(e) => return Err(io_error(format!("creating {}", dir.display()), e)),
        }
    }
    Err(io_error(
        format!("creating a unique directory under {}", base.display()),
        last_error.unwrap_or_else(|| io::Error::other("no attempt made")),
    ))
}

/// A free TCP port on 127.0.0.1 (free when this returns; may be raced).
fn free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| io_error("binding 127.0.0.1:0 to pick a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| io_error("reading the picked port", e))?
        .port();
    Ok(port)
}

/// How a cluster's nodes listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listen {
    /// Plain TCP on a free port of 127.0.0.1.
    Tcp,
    /// A Unix socket in the cluster's directory (TCP port 0).
    Unix,
    /// TLS on a free port of 127.0.0.1, with the certificates that
    /// [`certs`](super::certs) made in the cluster's directory, and plain
    /// TCP on another port for the harness's own use.
    Tls,
}

/// Where a node listens.
#[derive(Debug, Clone)]
pub(super) enum Address {
    Tcp(u16),
    Unix(PathBuf),
    /// Clients use `tls_port`; the harness (readiness, inspection) uses
    /// the plain `port`.
    Tls {
        port: u16,
        tls_port: u16,
    },
}

impl Address {
    /// The URL clients use.
    pub(super) fn url(&self) -> String {
        match self {
            Address::Tls { tls_port, .. } => format!("rediss://127.0.0.1:{tls_port}"),
            _ => self.plain_url(),
        }
    }

    /// The URL of the harness's own connections: plain, without TLS.
    pub(super) fn plain_url(&self) -> String {
        match self {
            Address::Tcp(port) | Address::Tls { port, .. } => format!("redis://127.0.0.1:{port}"),
            Address::Unix(path) => format!("redis+unix://{}", path.display()),
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Address::Tcp(port) => format!("127.0.0.1:{port}"),
            Address::Unix(path) => path.display().to_string(),
            Address::Tls { port, tls_port } => {
                format!("127.0.0.1:{tls_port} (TLS; plain on {port})")
            }
        }
    }
}

/// What a node needs to (re)start: the binary, its directory and its index.
#[derive(Debug, Clone)]
pub(super) struct Spawner {
    pub(super) binary: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) index: usize,
    /// The cluster's record, which learns every server spawned (`None`
    /// where no record is kept).
    pub(super) record: Option<PathBuf>,
    /// Whether the node logs every write to its append-only file and syncs
    /// it before it answers (`appendonly yes`, `appendfsync always`).
    pub(super) persistent: bool,
}

/// Why one launch attempt failed.
enum LaunchError {
    /// The server exited before it was ready (typically: the port was taken);
    /// worth another attempt.
    Exited(HarnessError),
    /// Anything else: give up.
    Fatal(HarnessError),
}

impl Spawner {
    pub(super) fn log_path(&self) -> PathBuf {
        self.dir.join(format!("node-{}.log", self.index))
    }

    pub(super) fn socket_path(&self) -> PathBuf {
        self.dir.join(format!("node-{}.sock", self.index))
    }

    /// Where the node saves its data set (only [`Node::restart_persisted`]
    /// makes it save).
    ///
    /// [`Node::restart_persisted`]: super::Node::restart_persisted
    pub(super) fn rdb_name(&self) -> String {
        format!("node-{}.rdb", self.index)
    }

    /// The name of the node's append-only file, one per node: Redis 6
    /// writes it in the cluster's directory, Redis 7 and Valkey name their
    /// files after it in `appendonlydir`.
    fn aof_name(&self) -> String {
        format!("node-{}.aof", self.index)
    }

    /// The persistence options: none, or every write logged and synced
    /// before the reply.
    fn persistence(&self) -> Vec<String> {
        if !self.persistent {
            return ["--save", "", "--appendonly", "no"]
                .map(String::from)
                .to_vec();
        }
        let options = [
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ];
        let mut args = options.map(String::from).to_vec();
        args.push("--appendfilename".to_owned());
        args.push(self.aof_name());
        args
    }

    fn spawn(&self, address: &Address) -> Result<Child, HarnessError> {
        let mut command = Command::new(&self.binary);
        command
            .current_dir(&self.dir)
            .arg("--dir")
            .arg(&self.dir)
            .args(self.persistence())
            .arg("--dbfilename")
            .arg(self.rdb_name())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--daemonize", "no"])
            .arg("--logfile")
            .arg(self.log_path());
        match address {
            Address::Tcp(port) => {
                command.arg("--port").arg(port.to_string());
            }
            Address::Unix(path) => {
                command
                    .args(["--port", "0", "--unixsocket"])
                    .arg(path)
                    .args(["--unixsocketperm", "700"]);
            }
            Address::Tls { port, tls_port } => {
                command
                    .arg("--port")
                    .arg(port.to_string())
                    .arg("--tls-port")
                    .arg(tls_port.to_string())
                    .args(["--tls-cert-file", certs::CERT_FILE])
                    .args(["--tls-key-file", certs::KEY_FILE])
                    .args(["--tls-ca-cert-file", certs::CA_FILE])
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = command.spawn().map_err(|e| {
            io_error(
                format!(
                    "spawning {} for node {} ({})",
                    self.binary.display(),
                    self.index,
                    address.describe()
                ),
                e,
            )
        })?;
        if let Some(record) = &self.record {
            if let Err(e) = record::add_server(record, child.id()) {
                reap(&mut child);
                return Err(e);
            }
        }
        Ok(child)
    }

    fn not_ready(&self, address: &Address, waited: Duration, reason: String) -> HarnessError {
        let log = self.log_path();
        HarnessError::NotReady {
            node: address.describe(),
            waited,
            reason,
            log_tail: log_tail(&log),
            log,
        }
    }

    /// Spawns one server and waits until it answers `PING` (and is really
    /// the process we spawned, not a stranger on a raced port).
    fn launch(&self, address: &Address) -> Result<Child, LaunchError> {
        let mut child = self.spawn(address).map_err(LaunchError::Fatal)?;
        let started = Instant::now();
        let url = address.plain_url();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    return Err(LaunchError::Exited(self.not_ready(
                        address,
                        started.elapsed(),
                        format!("redis-server exited early ({status})"),
                    )));
                }
                Ok(None) => {}
                Err(e) => {
                    reap(&mut child);
                    return Err(LaunchError::Fatal(io_error(
                        format!("checking on redis-server pid {}", child.id()),
                        e,
                    )));
                }
            }
            if probe(&url) == Some(child.id()) {
                return Ok(child);
            }
            if started.elapsed() >= READY_TIMEOUT {
                reap(&mut child);
                return Err(LaunchError::Fatal(self.not_ready(
                    address,
                    started.elapsed(),
                    format!("no PONG from {url}"),
                )));
            }
            thread::sleep(READY_POLL);
        }
    }

    /// Starts a TCP node (with `tls`, a TLS node) on fresh ports, trying
    /// others when a picked one turns out to be taken.
    pub(super) fn launch_on_fresh_port(&self, tls: bool) -> Result<(Child, Address), HarnessError> {
        let mut attempt = 1;
        loop {
            let port = free_port()?;
            let address = if tls {
                let mut tls_port = free_port()?;
                while tls_port == port {
                    tls_port = free_port()?;
                }
                Address::Tls { port, tls_port }
            } else {
                Address::Tcp(port)
            };
            match self.launch(&address) {
                Ok(child) => return Ok((child, address)),
                Err(LaunchError::Exited(_)) if attempt < PORT_ATTEMPTS => attempt += 1,
                Err(LaunchError::Exited(e) | LaunchError::Fatal(e)) => return Err(e),
            }
        }
    }

    /// Starts a node on a fixed address, retrying for a short while when the
    /// server exits early (address not free yet).
    pub(super) fn launch_on(&self, address: &Address) -> Result<Child, HarnessError> {
        let deadline = Instant::now() + SAME_ADDRESS_RETRY;
        loop {
            match self.launch(address) {
                Ok(child) => return Ok(child),
                Err(LaunchError::Fatal(e)) => return Err(e),
                Err(LaunchError::Exited(e)) => {
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    thread::sleep(SAME_ADDRESS_POLL);
                }
            }
        }
    }
}

/// SIGKILL + wait, ignoring errors (used on failure paths and in Drop).
fn reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// One readiness probe: the pid of the server answering `PING` at `url`.
fn probe(url: &str) -> Option<u32> {
    let client = redis::Client::open(url).ok()?;
    let mut con = client.get_connection_with_timeout(PROBE_TIMEOUT).ok()?;
    con.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    con.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    let pong: String = redis::cmd("PING").query(&mut con).ok()?;
    if pong != "PONG" {
        return None;
    }
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// The last lines of a log file, or a note saying why there are none.
fn log_tail(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(LOG_TAIL_LINES);
            if lines.is_empty() {
                "(log file is empty)".to_owned()
            } else {
                lines[start..].join("\n")
            }
        }
        Err(e) => format!("(no log: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let path = std::env::temp_dir().join(format!(
            "redlock-sync-logtail-{}-{}",
            std::process::id(),
            random_hex().unwrap()
        ));
        let text: String = (0..50).map(|i| format!("line {i}\n")).collect();
        fs::write(&path, text).unwrap();
        let tail = log_tail(&path);
        fs::remove_file(&path).unwrap();
        assert_eq!(tail.lines().count(), LOG_TAIL_LINES);
        assert!(tail.starts_with("line 30"));
        assert!(tail.ends_with("line 49"));
    }
}
