//! Throwaway **real** `redis-server` processes for tests, examples and
//! benchmarks, plus a fault-injecting TCP [`Proxy`].
//!
//! This module is compiled only with the `testing` feature. It is what the
//! crate's own tests use, and you can use it to test your own code that builds
//! on `redlock-sync` against real, independent Redis masters:
//!
//! * [`Cluster::start`] / [`Cluster::start_unix`] start `n` independent
//!   `redis-server` masters (no replication, no persistence) listening on
//!   `127.0.0.1` or on Unix sockets, each in a private temporary directory.
//! * Every [`Node`] can be killed ([`Node::kill`], SIGKILL: the node forgets
//!   everything), started again on the same address ([`Node::start`],
//!   [`Node::restart`]), frozen ([`Node::pause`], SIGSTOP: connections hang)
//!   and thawed ([`Node::resume`]), and inspected ([`Node::get`],
//!   [`Node::pttl`], [`Node::keys`], [`Node::query`], ...).
//! * A [`Proxy`] sits in front of one TCP address and can delay, silently
//!   drop (partition) or reset the traffic while connections are open
//!   ([`Fault`]).
//!
//! Dropping a [`Cluster`] kills (SIGKILL) and reaps every `redis-server` it
//! started, even paused ones and even when a test panics, and removes its
//! temporary directory. Dropping a [`Proxy`] closes all its sockets and joins
//! all its threads. Everything is safe to use from parallel tests, in one test
//! binary or in several at once: every cluster has its own directory and its
//! own ports.
//!
//! # Requirements
//!
//! `redis-server` (Redis 6 or later, or a compatible server such as Valkey)
//! must be installed: it is looked up in the `REDIS_SERVER` environment
//! variable (a path, or a program name searched on `PATH`), else as
//! `redis-server` on `PATH`. When it cannot be found the harness returns
//! [`HarnessError::NotInstalled`], whose message says how to install it; it
//! never skips silently. Pausing and resuming use the `kill` program (for
//! `kill -STOP` / `kill -CONT`), so this module targets Unix-like systems.
//!
//! # Example
//!
//! ```
//! use redlock_sync::testing::Cluster;
//!
//! # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
//! let cluster = Cluster::start(3)?;
//! assert_eq!(cluster.len(), 3);
//!
//! cluster.node(0).set("greeting", "hello")?;
//! assert_eq!(cluster.node(0).get("greeting")?.as_deref(), Some("hello"));
//!
//! // Kill one master: it becomes unreachable ...
//! cluster.node(0).kill()?;
//! assert!(cluster.node(0).get("greeting").is_err());
//! // ... and comes back on the same address, empty.
//! cluster.node(0).start()?;
//! assert_eq!(cluster.node(0).get("greeting")?, None);
//! # Ok(())
//! # }
//! ```

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub use crate::node::{io_counts, IoCounts};

/// How long a freshly spawned node may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Sleep between two readiness probes.
const READY_POLL: Duration = Duration::from_millis(5);
/// Connect and I/O timeout of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long [`Node::start`] / [`Node::restart`] retry when the address is
/// not free yet.
const SAME_ADDRESS_RETRY: Duration = Duration::from_secs(2);
/// Sleep between two attempts to start on the same address.
const SAME_ADDRESS_POLL: Duration = Duration::from_millis(20);
/// How many fresh ports a TCP node tries before giving up.
const PORT_ATTEMPTS: usize = 8;
/// Connect timeout of the inspection helpers (and of the proxy's upstream
/// connections).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Read/write timeout of the inspection helpers.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of a node's log file quoted in [`HarnessError::NotReady`].
const LOG_TAIL_LINES: usize = 20;
/// Unix socket paths must stay below this many bytes.
const MAX_SOCKET_PATH: usize = 100;
/// How long `pause`/`resume` wait for the process state to change (Linux).
const SIGNAL_SETTLE: Duration = Duration::from_secs(1);
/// Poll interval of the proxy's accept loop and pipe threads.
const PROXY_POLL: Duration = Duration::from_millis(5);

/// Counter that makes cluster directory names unique within this process.
static CLUSTER_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// `redis-server` is not on `PATH` (or `REDIS_SERVER` points nowhere).
    #[error(
        "redis-server not found on PATH: install it (Debian/Ubuntu: `sudo apt-get install redis-server`, \
         macOS: `brew install redis`) or set REDIS_SERVER to its path"
    )]
    NotInstalled,
    /// A node did not become ready (it exited early, or did not answer
    /// `PING` in time).
    #[error(
        "redis node {node} did not become ready after {waited:?}: {reason}; last lines of {}:\n{log_tail}",
        .log.display()
    )]
    NotReady {
        /// The node's address: `127.0.0.1:PORT` or the Unix socket path.
        node: String,
        /// How long the harness waited for it.
        waited: Duration,
        /// What went wrong (early exit with its status, or no answer).
        reason: String,
        /// The node's log file.
        log: PathBuf,
        /// The last lines of the node's log file.
        log_tail: String,
    },
    /// An I/O error while spawning or signalling processes, creating
    /// directories, running the proxy, etc.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A Redis error in one of the inspection helpers ([`Node::get`], ...).
    #[error("{context}: {source}")]
    Redis {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: redis::RedisError,
    },
}

fn io_error(context: impl Into<String>, source: io::Error) -> HarnessError {
    HarnessError::Io {
        context: context.into(),
        source,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------
// Finding redis-server
// ---------------------------------------------------------------------------

/// The `redis-server` to run, from `REDIS_SERVER` or `PATH`.
fn redis_server_binary() -> Result<PathBuf, HarnessError> {
    find_redis_server(std::env::var_os("REDIS_SERVER"), std::env::var_os("PATH"))
}

fn find_redis_server(
    env_value: Option<OsString>,
    path_var: Option<OsString>,
) -> Result<PathBuf, HarnessError> {
    let name = match env_value {
        Some(value) if !value.is_empty() => value,
        _ => OsString::from("redis-server"),
    };
    let as_path = PathBuf::from(&name);
    if as_path.is_absolute() || as_path.components().count() > 1 {
        // A path (absolute or relative): use it as is.
        return if is_executable(&as_path) {
            Ok(as_path)
        } else {
            Err(HarnessError::NotInstalled)
        };
    }
    search_path(&name, path_var.as_deref()).ok_or(HarnessError::NotInstalled)
}

fn search_path(name: &OsStr, path_var: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path_var?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    let Ok(meta) = fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

// ---------------------------------------------------------------------------
// Temporary directories, ports, spawning
// ---------------------------------------------------------------------------

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
fn make_cluster_dir(unix_sockets: bool, nodes: usize) -> Result<PathBuf, HarnessError> {
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

/// Where a node listens.
#[derive(Debug, Clone)]
enum Address {
    Tcp(u16),
    Unix(PathBuf),
}

impl Address {
    fn url(&self) -> String {
        match self {
            Address::Tcp(port) => format!("redis://127.0.0.1:{port}"),
            Address::Unix(path) => format!("redis+unix://{}", path.display()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Address::Tcp(port) => format!("127.0.0.1:{port}"),
            Address::Unix(path) => path.display().to_string(),
        }
    }
}

/// What a node needs to (re)start: the binary, its directory and its index.
#[derive(Debug, Clone)]
struct Spawner {
    binary: PathBuf,
    dir: PathBuf,
    index: usize,
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
    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("node-{}.log", self.index))
    }

    fn socket_path(&self) -> PathBuf {
        self.dir.join(format!("node-{}.sock", self.index))
    }

    fn spawn(&self, address: &Address) -> Result<Child, HarnessError> {
        let mut command = Command::new(&self.binary);
        command
            .current_dir(&self.dir)
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", "", "--appendonly", "no"])
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
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command.spawn().map_err(|e| {
            io_error(
                format!(
                    "spawning {} for node {} ({})",
                    self.binary.display(),
                    self.index,
                    address.describe()
                ),
                e,
            )
        })
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
        let url = address.url();
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

    /// Starts a TCP node on a fresh port, trying other ports when the picked
    /// one turns out to be taken.
    fn launch_on_fresh_port(&self) -> Result<(Child, u16), HarnessError> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            match self.launch(&Address::Tcp(port)) {
                Ok(child) => return Ok((child, port)),
                Err(LaunchError::Exited(e)) => last = Some(e),
                Err(LaunchError::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or(HarnessError::NotInstalled))
    }

    /// Starts a node on a fixed address, retrying for a short while when the
    /// server exits early (address not free yet).
    fn launch_on(&self, address: &Address) -> Result<Child, HarnessError> {
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

/// Sends a signal to `pid` by running the `kill` program (`kill -STOP pid`).
fn send_signal(signal: &str, pid: u32) -> Result<(), HarnessError> {
    let context = || format!("running `kill -{signal} {pid}`");
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| io_error(context(), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(io_error(
            context(),
            io::Error::other(format!("kill exited with {status}")),
        ))
    }
}

/// The one-letter state of a process from `/proc/<pid>/stat`, where there is
/// a `/proc` (Linux).
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": comm may contain anything, so look after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// Waits (bounded) until `/proc` reports the process stopped or not stopped,
/// so that `pause` / `resume` are in effect when they return. A no-op where
/// there is no `/proc`.
fn settle(pid: u32, stopped: bool) {
    let deadline = Instant::now() + SIGNAL_SETTLE;
    while let Some(state) = proc_state(pid) {
        let is_stopped = state == 'T' || state == 't';
        if is_stopped == stopped || Instant::now() >= deadline {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------

/// `n` independent `redis-server` masters, each in the cluster's own
/// temporary directory, without persistence.
///
/// Dropping the cluster kills (SIGKILL) and reaps every server it started,
/// paused ones included, and removes the temporary directory. A `Cluster` is
/// `Send + Sync`: share it by reference across threads.
///
/// ```
/// use redlock_sync::testing::Cluster;
///
/// # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
/// let cluster = Cluster::start(3)?;
/// for (i, url) in cluster.urls().iter().enumerate() {
///     assert!(url.starts_with("redis://127.0.0.1:"));
///     assert_eq!(*url, cluster.node(i).url());
/// }
/// let client = redis::Client::open(cluster.urls()[1].as_str()).unwrap();
/// let mut con = client.get_connection().unwrap();
/// redis::cmd("SET").arg("k").arg("v").exec(&mut con).unwrap();
/// assert_eq!(cluster.node(1).keys()?, vec!["k".to_owned()]);
/// assert!(cluster.node(0).keys()?.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl Cluster {
    /// Starts `n` masters listening on `127.0.0.1` (each on its own free
    /// port), in parallel, and waits until every one answers `PING`.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotInstalled`] if `redis-server` cannot be found,
    /// [`HarnessError::NotReady`] if a node does not come up (with the tail of
    /// its log), [`HarnessError::Io`] for I/O failures. Nodes already started
    /// are stopped again before the error is returned.
    pub fn start(n: usize) -> Result<Cluster, HarnessError> {
        Self::launch(redis_server_binary()?, n, false)
    }

    /// Starts `n` masters that listen only on Unix sockets (TCP port 0) in
    /// the cluster's temporary directory. Their URLs are
    /// `redis+unix:///path/to/node-<i>.sock`; [`Node::port`] is `None`.
    ///
    /// The socket paths are kept below 100 bytes: if the system temporary
    /// directory has a long path, `/tmp` is used instead.
    ///
    /// ```
    /// use redlock_sync::testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
    /// let cluster = Cluster::start_unix(2)?;
    /// assert!(cluster.urls()[0].starts_with("redis+unix:///"));
    /// assert_eq!(cluster.node(0).port(), None);
    /// cluster.node(0).set("k", "v")?;
    /// assert_eq!(cluster.node(0).get("k")?.as_deref(), Some("v"));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Cluster::start`].
    pub fn start_unix(n: usize) -> Result<Cluster, HarnessError> {
        Self::launch(redis_server_binary()?, n, true)
    }

    fn launch(binary: PathBuf, n: usize, unix_sockets: bool) -> Result<Cluster, HarnessError> {
        let dir = make_cluster_dir(unix_sockets, n)?;
        // From here on, Drop cleans up whatever was started.
        let mut cluster = Cluster {
            dir,
            nodes: Vec::with_capacity(n),
        };
        let results: Vec<Result<Node, HarnessError>> = thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|index| {
                    let spawner = Spawner {
                        binary: binary.clone(),
                        dir: cluster.dir.clone(),
                        index,
                    };
                    scope.spawn(move || Node::launch(spawner, unix_sockets))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let mut first_error = None;
        for result in results {
            match result {
                Ok(node) => cluster.nodes.push(node),
                Err(e) => {
                    if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(cluster),
        }
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node (`Cluster::start(0)`).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes' URLs in node order: `redis://127.0.0.1:PORT` or
    /// `redis+unix:///path/to/node-<i>.sock`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// The node at index `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, like slice indexing.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// All nodes, in order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The cluster's temporary directory (nodes' logs `node-<i>.log` and
    /// Unix sockets `node-<i>.sock`). It is removed when the cluster drops.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts a [`Proxy`] in front of every node; returns them in node order.
    ///
    /// ```
    /// use redlock_sync::testing::{Cluster, Fault};
    ///
    /// # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
    /// let cluster = Cluster::start(2)?;
    /// let proxies = cluster.proxies()?;
    /// let client = redis::Client::open(proxies[0].url()).unwrap();
    /// let mut con = client.get_connection().unwrap();
    /// redis::cmd("SET").arg("k").arg("v").exec(&mut con).unwrap();
    /// assert_eq!(cluster.node(0).get("k")?.as_deref(), Some("v"));
    /// proxies[0].set_fault(Fault::Reset);
    /// assert!(redis::cmd("GET").arg("k").query::<String>(&mut con).is_err());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] for a Unix-socket cluster (the proxy is TCP only)
    /// or if a proxy cannot start.
    pub fn proxies(&self) -> Result<Vec<Proxy>, HarnessError> {
        self.nodes
            .iter()
            .map(|node| match node.port() {
                Some(port) => Proxy::start(&format!("127.0.0.1:{port}")),
                None => Err(io_error(
                    format!(
                        "Cluster::proxies: node {} listens on a Unix socket; proxies need TCP nodes (Cluster::start)",
                        node.spawner.index
                    ),
                    io::Error::new(io::ErrorKind::Unsupported, "not a TCP node"),
                )),
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.kill_quietly();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// Node
// ---------------------------------------------------------------------------

/// One `redis-server` of a [`Cluster`].
///
/// Every method takes `&self` (the process handle sits behind a mutex), so a
/// node can be killed, paused or restarted from any thread while others use
/// it. The address never changes: [`Node::start`] and [`Node::restart`] come
/// back on the same port or socket path. There is no persistence: a killed
/// or restarted node has lost all its data.
///
/// ```
/// use redlock_sync::testing::Cluster;
///
/// # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
/// let cluster = Cluster::start(1)?;
/// let node = cluster.node(0);
/// let port = node.port();
/// node.set("k", "v")?;
///
/// node.restart()?;
/// assert_eq!(node.port(), port);
/// assert_eq!(node.get("k")?, None);
///
/// node.kill()?;
/// assert_eq!(node.pid(), None);
/// node.kill()?; // idempotent
/// node.start()?;
/// assert!(node.pid().is_some());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Node {
    spawner: Spawner,
    address: Address,
    state: Mutex<NodeState>,
}

#[derive(Debug, Default)]
struct NodeState {
    child: Option<Child>,
    paused: bool,
}

impl Node {
    fn launch(spawner: Spawner, unix_sockets: bool) -> Result<Node, HarnessError> {
        let (child, address) = if unix_sockets {
            let path = spawner.socket_path();
            if path.as_os_str().len() >= MAX_SOCKET_PATH {
                return Err(io_error(
                    format!("Unix socket path {} is too long", path.display()),
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("socket paths must stay under {MAX_SOCKET_PATH} bytes"),
                    ),
                ));
            }
            let address = Address::Unix(path);
            (spawner.launch_on(&address)?, address)
        } else {
            let (child, port) = spawner.launch_on_fresh_port()?;
            (child, Address::Tcp(port))
        };
        Ok(Node {
            spawner,
            address,
            state: Mutex::new(NodeState {
                child: Some(child),
                paused: false,
            }),
        })
    }

    /// The node's URL: `redis://127.0.0.1:PORT` or
    /// `redis+unix:///path/to/node-<i>.sock`. Stable across restarts.
    pub fn url(&self) -> String {
        self.address.url()
    }

    /// The TCP port, or `None` for a Unix-socket node.
    pub fn port(&self) -> Option<u16> {
        match self.address {
            Address::Tcp(port) => Some(port),
            Address::Unix(_) => None,
        }
    }

    /// The server's process id, or `None` while the node is killed.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.state).child.as_ref().map(Child::id)
    }

    /// The node's log file (inside the cluster's temporary directory).
    pub fn log_path(&self) -> PathBuf {
        self.spawner.log_path()
    }

    /// Kills the server (SIGKILL, which also works on a paused server) and
    /// reaps it. Idempotent: killing a killed node does nothing. The node
    /// forgets all its data.
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] if the process cannot be reaped.
    pub fn kill(&self) -> Result<(), HarnessError> {
        let mut state = lock(&self.state);
        Self::kill_locked(&mut state)
    }

    fn kill_locked(state: &mut NodeState) -> Result<(), HarnessError> {
        state.paused = false;
        let Some(mut child) = state.child.take() else {
            return Ok(());
        };
        let pid = child.id();
        // kill() may fail if the process already exited; wait() is what
        // matters (it reaps the process).
        let _ = child.kill();
        child
            .wait()
            .map(drop)
            .map_err(|e| io_error(format!("waiting for killed redis-server pid {pid}"), e))
    }

    fn kill_quietly(&self) {
        let _ = self.kill();
    }

    /// Freezes the server with SIGSTOP (`kill -STOP <pid>`): connections stay
    /// open but nothing is answered until [`Node::resume`]. On Linux this
    /// returns once the process is actually stopped.
    ///
    /// ```
    /// use redlock_sync::testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
    /// let cluster = Cluster::start(1)?;
    /// let node = cluster.node(0);
    /// node.pause()?;
    /// assert!(node.is_paused());
    /// assert!(node.get("k").is_err()); // times out
    /// node.resume()?;
    /// assert_eq!(node.get("k")?, None);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] if the node is killed or `kill` fails.
    pub fn pause(&self) -> Result<(), HarnessError> {
        let mut state = lock(&self.state);
        let Some(pid) = state.child.as_ref().map(Child::id) else {
            return Err(io_error(
                format!("pausing node {}", self.address.describe()),
                io::Error::new(io::ErrorKind::NotConnected, "the node is not running"),
            ));
        };
        // The child is not reaped until kill_locked, so the pid is still ours.
        send_signal("STOP", pid)?;
        state.paused = true;
        settle(pid, true);
        Ok(())
    }

    /// Thaws a paused server with SIGCONT (`kill -CONT <pid>`). Does nothing
    /// if the node is killed.
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] if `kill` fails.
    pub fn resume(&self) -> Result<(), HarnessError> {
        let mut state = lock(&self.state);
        let Some(pid) = state.child.as_ref().map(Child::id) else {
            state.paused = false;
            return Ok(());
        };
        send_signal("CONT", pid)?;
        state.paused = false;
        settle(pid, false);
        Ok(())
    }

    /// Whether the node is paused ([`Node::pause`] without [`Node::resume`]).
    pub fn is_paused(&self) -> bool {
        lock(&self.state).paused
    }

    /// Kills the server if it runs (see [`Node::kill`]), then starts it again
    /// on the same port or socket path and waits until it answers `PING`.
    /// The data is gone.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotReady`] if it does not come back (for instance the
    /// port stayed taken for ~2 s), [`HarnessError::Io`] otherwise.
    pub fn restart(&self) -> Result<(), HarnessError> {
        let mut state = lock(&self.state);
        Self::kill_locked(&mut state)?;
        self.start_locked(&mut state)
    }

    /// Starts a killed node again on the same address and waits until it
    /// answers `PING`. Does nothing if the node runs (a node whose process
    /// died by itself is reaped and started again).
    ///
    /// # Errors
    ///
    /// As for [`Node::restart`].
    pub fn start(&self) -> Result<(), HarnessError> {
        let mut state = lock(&self.state);
        if let Some(child) = state.child.as_mut() {
            match child.try_wait() {
                Ok(None) => return Ok(()),
                Ok(Some(_)) => Self::kill_locked(&mut state)?,
                Err(e) => {
                    return Err(io_error(
                        format!("checking on redis-server pid {}", child.id()),
                        e,
                    ))
                }
            }
        }
        self.start_locked(&mut state)
    }

    fn start_locked(&self, state: &mut NodeState) -> Result<(), HarnessError> {
        let child = self.spawner.launch_on(&self.address)?;
        state.child = Some(child);
        state.paused = false;
        Ok(())
    }

    // -- inspection helpers --------------------------------------------------

    fn connection(&self) -> Result<redis::Connection, HarnessError> {
        let url = self.url();
        let fail = |source| HarnessError::Redis {
            context: format!("connecting to {url}"),
            source,
        };
        let client = redis::Client::open(url.as_str()).map_err(fail)?;
        let con = client
            .get_connection_with_timeout(CONNECT_TIMEOUT)
            .map_err(fail)?;
        con.set_read_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
        con.set_write_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
        Ok(con)
    }

    fn run<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        what: &str,
    ) -> Result<T, HarnessError> {
        let mut con = self.connection()?;
        cmd.query(&mut con).map_err(|source| HarnessError::Redis {
            context: format!("{what} on {}", self.url()),
            source,
        })
    }

    /// `GET key` over a fresh connection (connect timeout 1 s, I/O timeout
    /// 2 s).
    ///
    /// # Errors
    ///
    /// [`HarnessError::Redis`] if the node is unreachable, paused, or
    /// answers with an error.
    pub fn get(&self, key: &str) -> Result<Option<String>, HarnessError> {
        self.run(redis::cmd("GET").arg(key), &format!("GET {key}"))
    }

    /// `PTTL key`: the remaining time to live in milliseconds, `-2` if the
    /// key does not exist, `-1` if it has no expiry.
    ///
    /// # Errors
    ///
    /// As for [`Node::get`].
    pub fn pttl(&self, key: &str) -> Result<i64, HarnessError> {
        self.run(redis::cmd("PTTL").arg(key), &format!("PTTL {key}"))
    }

    /// Plain `SET key value` (no expiry), for instance to plant a foreign
    /// value under a lock's key.
    ///
    /// # Errors
    ///
    /// As for [`Node::get`].
    pub fn set(&self, key: &str, value: &str) -> Result<(), HarnessError> {
        self.run::<redis::Value>(redis::cmd("SET").arg(key).arg(value), &format!("SET {key}"))
            .map(drop)
    }

    /// Any command, e.g. `node.query(&["SET", "k", "v", "PX", "1000"])`.
    /// Error replies come back as [`HarnessError::Redis`].
    ///
    /// ```
    /// use redlock_sync::testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
    /// let cluster = Cluster::start(1)?;
    /// let node = cluster.node(0);
    /// node.query(&["SET", "k", "v", "PX", "60000"])?;
    /// assert!(node.pttl("k")? > 0);
    /// assert_eq!(node.query(&["EXISTS", "k"])?, redis::Value::Int(1));
    /// assert!(node.query(&["NO-SUCH-COMMAND"]).is_err());
    /// node.flushall()?;
    /// assert_eq!(node.pttl("k")?, -2);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Node::get`]; [`HarnessError::Io`] if `args` is empty.
    pub fn query(&self, args: &[&str]) -> Result<redis::Value, HarnessError> {
        let Some((name, rest)) = args.split_first() else {
            return Err(io_error(
                "Node::query",
                io::Error::new(io::ErrorKind::InvalidInput, "no command given"),
            ));
        };
        let mut cmd = redis::cmd(name);
        for arg in rest {
            cmd.arg(*arg);
        }
        self.run(&cmd, &args.join(" "))
    }

    /// `KEYS *`, sorted: handy to check that nothing was left behind.
    ///
    /// # Errors
    ///
    /// As for [`Node::get`].
    pub fn keys(&self) -> Result<Vec<String>, HarnessError> {
        let mut keys: Vec<String> = self.run(redis::cmd("KEYS").arg("*"), "KEYS *")?;
        keys.sort();
        Ok(keys)
    }

    /// `FLUSHALL`: removes every key.
    ///
    /// # Errors
    ///
    /// As for [`Node::get`].
    pub fn flushall(&self) -> Result<(), HarnessError> {
        self.run::<redis::Value>(&redis::cmd("FLUSHALL"), "FLUSHALL")
            .map(drop)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = Self::kill_locked(state);
    }
}

// ---------------------------------------------------------------------------
// Proxy
// ---------------------------------------------------------------------------

/// What a [`Proxy`] does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Forward bytes as they come.
    None,
    /// Forward each chunk of bytes this long after it was read, in each
    /// direction (a round trip costs twice the delay). Order is preserved and
    /// nothing is lost.
    Delay(Duration),
    /// Accept and hold connections but forward nothing in either direction:
    /// bytes read are discarded. Connections stay open but silent, like
    /// behind a network partition.
    Partition,
    /// Close every existing connection now, and close new ones right after
    /// accepting them: peers see EOF or a reset.
    Reset,
    /// Forward requests as they come, and replies one byte at a time, each
    /// this long after the one before: a server that never goes silent long
    /// enough for a read to time out, yet takes forever to answer.
    TrickleReplies(Duration),
}

/// A TCP proxy on `127.0.0.1` in front of one address, whose [`Fault`] can
/// be switched while connections are open.
///
/// It uses std threads only: one accept loop (a blocking accept, woken by a
/// connection to itself on drop) and two per connection. Dropping the proxy
/// closes its listener and every connection and joins all its threads before
/// `drop` returns.
///
/// ```
/// use std::time::Duration;
/// use redlock_sync::testing::{Cluster, Fault, Proxy};
///
/// # fn main() -> Result<(), redlock_sync::testing::HarnessError> {
/// let cluster = Cluster::start(1)?;
/// let port = cluster.node(0).port().unwrap();
/// let proxy = Proxy::start(&format!("127.0.0.1:{port}"))?;
///
/// let client = redis::Client::open(proxy.url()).unwrap();
/// let mut con = client.get_connection().unwrap();
/// con.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
/// let pong: String = redis::cmd("PING").query(&mut con).unwrap();
/// assert_eq!(pong, "PONG");
///
/// proxy.set_fault(Fault::Partition);
/// assert_eq!(proxy.fault(), Fault::Partition);
/// let err = redis::cmd("PING").query::<String>(&mut con).unwrap_err();
/// assert!(err.is_timeout());
/// # Ok(())
/// # }
/// ```
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    acceptor: Option<JoinHandle<()>>,
}

struct ProxyShared {
    target: SocketAddr,
    fault: Mutex<Fault>,
    stop: AtomicBool,
    next_id: AtomicU64,
    /// Sockets of live connections (clones), so that `Reset` and `Drop` can
    /// shut them down.
    conns: Mutex<Vec<ConnSockets>>,
    /// Connection threads (each joins its second pipe thread).
    threads: Mutex<Vec<JoinHandle<()>>>,
}

struct ConnSockets {
    id: u64,
    client: TcpStream,
    server: Option<TcpStream>,
}

/// How a pipe ended.
#[derive(Debug, PartialEq, Eq)]
enum PipeEnd {
    /// The source said EOF and everything read was delivered.
    Eof,
    /// Error, reset or shutdown: tear the whole connection down.
    Abort,
}

impl ProxyShared {
    fn fault(&self) -> Fault {
        *lock(&self.fault)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn shutdown_all(&self) {
        for conn in lock(&self.conns).iter() {
            let _ = conn.client.shutdown(Shutdown::Both);
            if let Some(server) = &conn.server {
                let _ = server.shutdown(Shutdown::Both);
            }
        }
    }

    fn register(&self, conn: ConnSockets) {
        lock(&self.conns).push(conn);
    }

    fn set_server(&self, id: u64, server: TcpStream) {
        if let Some(conn) = lock(&self.conns).iter_mut().find(|c| c.id == id) {
            conn.server = Some(server);
        }
    }

    fn unregister(&self, id: u64) {
        lock(&self.conns).retain(|c| c.id != id);
    }
}

impl Proxy {
    /// Starts a proxy listening on `127.0.0.1:0` (a free port) that forwards
    /// to `target` (`"127.0.0.1:PORT"`; a `redis://` prefix is accepted too).
    /// The fault is initially [`Fault::None`].
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] if `target` does not resolve or the listener
    /// cannot be set up.
    pub fn start(target: &str) -> Result<Proxy, HarnessError> {
        let bare = target.strip_prefix("redis://").unwrap_or(target);
        let bare = bare.trim_end_matches('/');
        let target_addr = bare
            .to_socket_addrs()
            .map_err(|e| io_error(format!("resolving proxy target {target:?}"), e))?
            .next()
            .ok_or_else(|| {
                io_error(
                    format!("resolving proxy target {target:?}"),
                    io::Error::new(io::ErrorKind::InvalidInput, "no address"),
                )
            })?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| io_error("binding the proxy on 127.0.0.1:0", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io_error("reading the proxy's address", e))?;
        let shared = Arc::new(ProxyShared {
            target: target_addr,
            fault: Mutex::new(Fault::None),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor_shared = Arc::clone(&shared);
        let acceptor = thread::Builder::new()
            .name(format!("proxy-accept-{}", addr.port()))
            .spawn(move || accept_loop(listener, acceptor_shared))
            .map_err(|e| io_error("spawning the proxy's accept thread", e))?;
        Ok(Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The proxy's listening address (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's URL: `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches the fault; it takes effect immediately for existing and new
    /// connections ([`Fault::Reset`] closes the existing ones right away).
    pub fn set_fault(&self, fault: Fault) {
        *lock(&self.shared.fault) = fault;
        if fault == Fault::Reset {
            self.shared.shutdown_all();
        }
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("target", &self.shared.target)
            .field("fault", &self.fault())
            .finish()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            // Wake the blocking accept with a connection of our own; the
            // acceptor then sees `stop` and returns, closing the listener.
            // (Should the connect fail, the listener's backlog is full, so
            // accept returns anyway.)
            let _ = TcpStream::connect_timeout(&self.addr, CONNECT_TIMEOUT);
            let _ = acceptor.join();
        }
        // No new connection thread can appear now; close every socket and
        // join the connection threads (which join their pipe threads).
        self.shared.shutdown_all();
        loop {
            let threads = std::mem::take(&mut *lock(&self.shared.threads));
            if threads.is_empty() {
                break;
            }
            for thread in threads {
                let _ = thread.join();
            }
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((stream, _)) => {
                if shared.stopped() || shared.fault() == Fault::Reset {
                    let _ = stream.shutdown(Shutdown::Both);
                    continue;
                }
                let conn_shared = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name("proxy-conn".to_owned())
                    .spawn(move || serve_connection(stream, conn_shared));
                // On failure the stream was dropped with the closure: closed.
                if let Ok(handle) = spawned {
                    let mut threads = lock(&shared.threads);
                    threads.retain(|t| !t.is_finished());
                    threads.push(handle);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A transient error (e.g. too many open files): try again shortly.
            Err(_) => thread::sleep(PROXY_POLL),
        }
    }
}

fn shutdown_both(a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

fn serve_connection(client: TcpStream, shared: Arc<ProxyShared>) {
    // Accepted sockets may inherit non-blocking mode (BSDs).
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let Ok(client_clone) = client.try_clone() else {
        return;
    };
    shared.register(ConnSockets {
        id,
        client: client_clone,
        server: None,
    });
    serve_registered(&client, id, &shared);
    let _ = client.shutdown(Shutdown::Both);
    shared.unregister(id);
}

fn serve_registered(client: &TcpStream, id: u64, shared: &Arc<ProxyShared>) {
    let server = match TcpStream::connect_timeout(&shared.target, CONNECT_TIMEOUT) {
        Ok(server) => server,
        Err(_) => {
            hold_while_partitioned(client, shared);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let Ok(server_clone) = server.try_clone() else {
        return;
    };
    shared.set_server(id, server_clone);
    // Registered first, checked second: a concurrent Reset or Drop either
    // saw this connection in the registry or is seen here.
    if shared.stopped() || shared.fault() == Fault::Reset {
        shutdown_both(client, &server);
        return;
    }
    let (Ok(client_w), Ok(server_r)) = (client.try_clone(), server.try_clone()) else {
        shutdown_both(client, &server);
        return;
    };
    let back_shared = Arc::clone(shared);
    let back = thread::Builder::new()
        .name("proxy-pipe".to_owned())
        .spawn(move || pipe(server_r, client_w, Direction::Replies, &back_shared));
    let Ok(back) = back else {
        shutdown_both(client, &server);
        return;
    };
    let (Ok(client_r), Ok(server_w)) = (client.try_clone(), server.try_clone()) else {
        shutdown_both(client, &server);
        let _ = back.join();
        return;
    };
    let forth_end = pipe(client_r, server_w, Direction::Requests, shared);
    let back_end = back.join().unwrap_or(PipeEnd::Abort);
    if forth_end == PipeEnd::Abort || back_end == PipeEnd::Abort {
        shutdown_both(client, &server);
    }
}

/// The target could not be reached: under a partition the client must still
/// see a silent open connection, so keep it (discarding what it sends) until
/// the fault changes; otherwise close it at once.
fn hold_while_partitioned(client: &TcpStream, shared: &ProxyShared) {
    let mut client = client;
    let _ = client.set_read_timeout(Some(PROXY_POLL));
    let mut buf = [0u8; 4096];
    while !shared.stopped() && shared.fault() == Fault::Partition {
        match client.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if is_transient(&e) => {}
            Err(_) => return,
        }
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Which way a pipe carries bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Requests,
    /// Server to client.
    Replies,
}

/// Copies `from` to `to` according to the current fault until EOF, error,
/// reset or shutdown. On EOF the write half of `to` is shut down.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    direction: Direction,
    shared: &ProxyShared,
) -> PipeEnd {
    let _ = to.set_write_timeout(Some(PROXY_POLL));
    let end = pipe_loop(&mut from, &mut to, direction, shared);
    match end {
        PipeEnd::Eof => {
            let _ = to.shutdown(Shutdown::Write);
        }
        PipeEnd::Abort => shutdown_both(&from, &to),
    }
    end
}

fn pipe_loop(
    from: &mut TcpStream,
    to: &mut TcpStream,
    direction: Direction,
    shared: &ProxyShared,
) -> PipeEnd {
    // The reader stamps each chunk with its delivery time; the writer sleeps
    // until then (a thread sleep is precise to microseconds, where a socket
    // read timeout rounds up to a scheduler tick) and delivers in order.
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::scope(|s| {
        let writer = s.spawn(move || deliver(to, &rx, direction, shared));
        let read_end = read_chunks(from, &tx, shared);
        drop(tx);
        let write_end = writer.join().unwrap_or(PipeEnd::Abort);
        if read_end == PipeEnd::Abort || write_end == PipeEnd::Abort {
            PipeEnd::Abort
        } else {
            PipeEnd::Eof
        }
    })
}

/// Reads chunks and queues them with their delivery time, until EOF, error,
/// reset or shutdown. Under a partition what is read is discarded.
fn read_chunks(
    from: &mut TcpStream,
    tx: &mpsc::Sender<(Instant, Vec<u8>)>,
    shared: &ProxyShared,
) -> PipeEnd {
    let _ = from.set_read_timeout(Some(PROXY_POLL));
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if shared.stopped() {
            return PipeEnd::Abort;
        }
        match from.read(&mut buf) {
            Ok(0) => return PipeEnd::Eof,
            Ok(n) => {
                let due = match shared.fault() {
                    Fault::None | Fault::TrickleReplies(_) => Instant::now(),
                    Fault::Delay(delay) => Instant::now() + delay,
                    Fault::Partition => continue,
                    Fault::Reset => return PipeEnd::Abort,
                };
                if tx.send((due, buf[..n].to_vec())).is_err() {
                    return PipeEnd::Abort;
                }
            }
            Err(e) if is_transient(&e) => {
                if shared.fault() == Fault::Reset {
                    return PipeEnd::Abort;
                }
            }
            Err(_) => return PipeEnd::Abort,
        }
    }
}

/// Delivers queued chunks at their time, in order; chunks due while a
/// partition is on are dropped. Returns when the reader is done and the
/// queue is empty, or on reset or shutdown.
fn deliver(
    to: &mut TcpStream,
    rx: &mpsc::Receiver<(Instant, Vec<u8>)>,
    direction: Direction,
    shared: &ProxyShared,
) -> PipeEnd {
    loop {
        if shared.stopped() || shared.fault() == Fault::Reset {
            return PipeEnd::Abort;
        }
        let (due, chunk) = match rx.recv_timeout(PROXY_POLL) {
            Ok(item) => item,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return PipeEnd::Eof,
        };
        if !sleep_until(due, shared) {
            return PipeEnd::Abort;
        }
        match shared.fault() {
            Fault::TrickleReplies(gap) if direction == Direction::Replies => {
                for byte in chunk {
                    if !sleep_until(Instant::now() + gap, shared) || !write_all(to, &[byte], shared)
                    {
                        return PipeEnd::Abort;
                    }
                }
            }
            Fault::Partition => {}
            _ => {
                if !write_all(to, &chunk, shared) {
                    return PipeEnd::Abort;
                }
            }
        }
    }
}

/// Sleeps until `due`; `false` if the proxy stops or resets meanwhile.
fn sleep_until(due: Instant, shared: &ProxyShared) -> bool {
    loop {
        if shared.stopped() || shared.fault() == Fault::Reset {
            return false;
        }
        let now = Instant::now();
        if due <= now {
            return true;
        }
        thread::sleep((due - now).min(PROXY_POLL));
    }
}

/// Writes all of `bytes` unless the proxy stops, the connection breaks or a
/// partition starts (then the rest is discarded). Returns `false` if the
/// connection must be torn down.
fn write_all(to: &mut TcpStream, mut bytes: &[u8], shared: &ProxyShared) -> bool {
    while !bytes.is_empty() {
        if shared.stopped() {
            return false;
        }
        match shared.fault() {
            Fault::Reset => return false,
            Fault::Partition => return true,
            Fault::None | Fault::Delay(_) | Fault::TrickleReplies(_) => {}
        }
        match to.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if is_transient(&e) => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(300);

    /// Sends a raw `PING` and reads the reply line.
    fn ping_over<S: Read + Write>(stream: &mut S) -> io::Result<String> {
        stream.write_all(b"PING\r\n")?;
        read_line(stream)
    }

    fn read_line<S: Read>(stream: &mut S) -> io::Result<String> {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            match stream.read(&mut byte)? {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("EOF after {line:?}"),
                    ))
                }
                _ => line.push(byte[0]),
            }
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    fn tcp(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(stream)
    }

    fn node_addr(node: &Node) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], node.port().expect("a TCP node")))
    }

    fn ping_tcp(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
        ping_over(&mut tcp(addr, timeout)?)
    }

    fn is_timeout(e: &io::Error) -> bool {
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        )
    }

    fn process_exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn harness_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Cluster>();
        check::<Node>();
        check::<Proxy>();
        check::<HarnessError>();
    }

    #[test]
    fn start_three_pingable_nodes() {
        let cluster = Cluster::start(3).unwrap();
        assert_eq!(cluster.len(), 3);
        assert!(!cluster.is_empty());
        assert_eq!(cluster.nodes().len(), 3);
        let urls = cluster.urls();
        for (i, node) in cluster.nodes().iter().enumerate() {
            let port = node.port().unwrap();
            assert_eq!(urls[i], format!("redis://127.0.0.1:{port}"));
            assert_eq!(node.url(), urls[i]);
            assert!(node.pid().is_some());
            assert!(!node.is_paused());
            assert_eq!(ping_tcp(node_addr(node), SHORT).unwrap(), "+PONG");
            assert_eq!(node.keys().unwrap(), Vec::<String>::new());
            assert!(node.log_path().starts_with(cluster.dir()));
        }
        let mut ports: Vec<_> = cluster.nodes().iter().map(Node::port).collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), 3, "ports must be distinct");
    }

    #[test]
    fn empty_cluster_and_out_of_range_index() {
        let cluster = Cluster::start(0).unwrap();
        assert!(cluster.is_empty());
        assert!(cluster.urls().is_empty());
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = cluster.node(0);
        }));
        assert!(result.is_err());
    }

    #[test]
    fn kill_makes_unreachable_and_start_brings_back_empty() {
        let cluster = Cluster::start(2).unwrap();
        let node = cluster.node(0);
        let port = node.port();
        node.set("k", "v").unwrap();
        cluster.node(1).set("k", "other").unwrap();
        let pid = node.pid().unwrap();

        node.kill().unwrap();
        assert_eq!(node.pid(), None);
        assert!(!process_exists(pid), "killed server must be reaped");
        assert!(TcpStream::connect_timeout(&node_addr(node), SHORT).is_err());
        assert!(matches!(node.get("k"), Err(HarnessError::Redis { .. })));
        node.kill().unwrap(); // idempotent
        node.resume().unwrap(); // nothing to resume

        node.start().unwrap();
        assert_eq!(node.port(), port);
        assert_eq!(ping_tcp(node_addr(node), SHORT).unwrap(), "+PONG");
        assert_eq!(node.get("k").unwrap(), None);
        assert!(node.keys().unwrap().is_empty());
        // The other node was untouched.
        assert_eq!(cluster.node(1).get("k").unwrap().as_deref(), Some("other"));

        // start() on a running node is a no-op.
        let pid = node.pid();
        node.start().unwrap();
        assert_eq!(node.pid(), pid);
    }

    #[test]
    fn pause_makes_ping_time_out_and_resume_answers() {
        let cluster = Cluster::start(1).unwrap();
        let node = cluster.node(0);
        let addr = node_addr(node);
        let mut open = tcp(addr, SHORT).unwrap();
        assert_eq!(ping_over(&mut open).unwrap(), "+PONG");

        node.pause().unwrap();
        assert!(node.is_paused());
        let err = ping_over(&mut open).unwrap_err();
        assert!(is_timeout(&err), "expected a timeout, got {err:?}");
        let err = ping_tcp(addr, SHORT).unwrap_err();
        assert!(is_timeout(&err), "expected a timeout, got {err:?}");
        assert!(node.get("k").is_err());

        node.resume().unwrap();
        assert!(!node.is_paused());
        // The PING sent while paused is answered now.
        open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(read_line(&mut open).unwrap(), "+PONG");
        assert_eq!(ping_tcp(addr, Duration::from_secs(2)).unwrap(), "+PONG");
        assert_eq!(node.get("k").unwrap(), None);
    }

    #[test]
    fn pause_a_killed_node_is_an_error() {
        let cluster = Cluster::start(1).unwrap();
        cluster.node(0).kill().unwrap();
        assert!(matches!(
            cluster.node(0).pause(),
            Err(HarnessError::Io { .. })
        ));
    }

    #[test]
    fn restart_keeps_the_port_and_loses_the_data() {
        let cluster = Cluster::start(1).unwrap();
        let node = cluster.node(0);
        let port = node.port();
        let pid = node.pid();
        node.set("k", "v").unwrap();
        node.query(&["SET", "t", "v", "PX", "60000"]).unwrap();

        node.restart().unwrap();
        assert_eq!(node.port(), port);
        assert_ne!(node.pid(), pid);
        assert_eq!(node.get("k").unwrap(), None);
        assert_eq!(node.pttl("t").unwrap(), -2);
        assert_eq!(ping_tcp(node_addr(node), SHORT).unwrap(), "+PONG");

        // Restarting a paused node works too, and the new one is not paused.
        node.pause().unwrap();
        node.restart().unwrap();
        assert!(!node.is_paused());
        assert_eq!(node.port(), port);
        assert_eq!(ping_tcp(node_addr(node), SHORT).unwrap(), "+PONG");

        // And a killed one.
        node.kill().unwrap();
        node.restart().unwrap();
        assert_eq!(node.port(), port);
        assert!(node.keys().unwrap().is_empty());
    }

    #[test]
    fn start_retries_while_the_port_is_taken() {
        let cluster = Cluster::start(1).unwrap();
        let node = cluster.node(0);
        let port = node.port().unwrap();
        node.kill().unwrap();

        // Someone else holds the port for good: NotReady after ~2 s, with
        // redis-server's complaint in the log tail.
        let squatter = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let started = Instant::now();
        let err = node.start().unwrap_err();
        assert!(started.elapsed() >= SAME_ADDRESS_RETRY);
        match &err {
            HarnessError::NotReady {
                node: name,
                log_tail,
                ..
            } => {
                assert_eq!(*name, format!("127.0.0.1:{port}"));
                assert!(log_tail.contains(&port.to_string()), "{log_tail}");
            }
            other => panic!("expected NotReady, got {other:?}"),
        }
        assert_eq!(node.pid(), None);

        // The port is freed while start() retries: it comes up on it.
        let release = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            drop(squatter);
        });
        node.start().unwrap();
        release.join().unwrap();
        assert_eq!(node.port(), Some(port));
        assert_eq!(ping_tcp(node_addr(node), SHORT).unwrap(), "+PONG");
    }

    #[test]
    fn nodes_can_be_driven_from_several_threads() {
        let cluster = Cluster::start(3).unwrap();
        thread::scope(|scope| {
            for node in cluster.nodes() {
                scope.spawn(move || {
                    node.set("k", "v").unwrap();
                    node.restart().unwrap();
                    assert_eq!(node.get("k").unwrap(), None);
                });
            }
        });
        for node in cluster.nodes() {
            assert_eq!(ping_tcp(node_addr(node), SHORT).unwrap(), "+PONG");
        }
    }

    #[test]
    fn inspection_helpers() {
        let cluster = Cluster::start(1).unwrap();
        let node = cluster.node(0);
        assert_eq!(node.get("missing").unwrap(), None);
        assert_eq!(node.pttl("missing").unwrap(), -2);
        node.set("plain", "value").unwrap();
        assert_eq!(node.get("plain").unwrap().as_deref(), Some("value"));
        assert_eq!(node.pttl("plain").unwrap(), -1);
        node.query(&["SET", "ttl", "x", "PX", "60000"]).unwrap();
        let pttl = node.pttl("ttl").unwrap();
        assert!(pttl > 50_000 && pttl <= 60_000, "{pttl}");
        assert_eq!(
            node.query(&["PING"]).unwrap(),
            redis::Value::SimpleString("PONG".to_owned())
        );
        assert_eq!(
            node.keys().unwrap(),
            vec!["plain".to_owned(), "ttl".to_owned()]
        );
        assert!(matches!(
            node.query(&["NO-SUCH-COMMAND"]),
            Err(HarnessError::Redis { .. })
        ));
        assert!(matches!(node.query(&[]), Err(HarnessError::Io { .. })));
        node.flushall().unwrap();
        assert!(node.keys().unwrap().is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn start_unix_works() {
        use std::os::unix::net::UnixStream;

        let cluster = Cluster::start_unix(2).unwrap();
        assert_eq!(cluster.len(), 2);
        for (i, node) in cluster.nodes().iter().enumerate() {
            assert_eq!(node.port(), None);
            let url = node.url();
            let path = url.strip_prefix("redis+unix://").unwrap();
            assert!(path.starts_with('/'));
            assert!(path.len() < MAX_SOCKET_PATH, "{path}");
            assert!(path.ends_with(&format!("node-{i}.sock")));
            let mut stream = UnixStream::connect(path).unwrap();
            stream.set_read_timeout(Some(SHORT)).unwrap();
            assert_eq!(ping_over(&mut stream).unwrap(), "+PONG");
        }
        let node = cluster.node(1);
        node.set("k", "v").unwrap();
        assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));
        assert!(cluster.node(0).keys().unwrap().is_empty());
        let url = node.url();
        node.restart().unwrap();
        assert_eq!(node.url(), url);
        assert_eq!(node.get("k").unwrap(), None);
        node.kill().unwrap();
        assert!(node.get("k").is_err());
        node.start().unwrap();
        assert!(node.keys().unwrap().is_empty());
        assert!(matches!(cluster.proxies(), Err(HarnessError::Io { .. })));
    }

    #[test]
    fn drop_leaves_no_process_and_no_directory() {
        let cluster = Cluster::start(3).unwrap();
        let dir = cluster.dir().to_path_buf();
        assert!(dir.is_dir());
        let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid().unwrap()).collect();
        for pid in &pids {
            assert!(process_exists(*pid));
        }
        // A paused node must die too, and so must a killed one stay dead.
        cluster.node(0).pause().unwrap();
        cluster.node(1).kill().unwrap();
        assert!(!process_exists(pids[1]));
        drop(cluster);
        for pid in &pids {
            assert!(!process_exists(*pid), "pid {pid} survived the drop");
        }
        assert!(!dir.exists(), "{} survived the drop", dir.display());

        let cluster = Cluster::start_unix(1).unwrap();
        let dir = cluster.dir().to_path_buf();
        let pid = cluster.node(0).pid().unwrap();
        drop(cluster);
        assert!(!process_exists(pid));
        assert!(!dir.exists());
    }

    #[test]
    fn drop_on_panic_cleans_up() {
        let mut seen = None;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let cluster = Cluster::start(1).unwrap();
            seen = Some((cluster.node(0).pid().unwrap(), cluster.dir().to_path_buf()));
            panic!("test failure inside a test");
        }));
        assert!(result.is_err());
        let (pid, dir) = seen.unwrap();
        assert!(!process_exists(pid));
        assert!(!dir.exists());
    }

    #[test]
    fn missing_binary_is_not_installed() {
        let err = find_redis_server(
            Some(OsString::from("/nonexistent/redis-server")),
            std::env::var_os("PATH"),
        )
        .unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));
        let message = err.to_string();
        assert_eq!(
            message,
            "redis-server not found on PATH: install it (Debian/Ubuntu: `sudo apt-get install redis-server`, \
             macOS: `brew install redis`) or set REDIS_SERVER to its path"
        );
        assert!(
            message.contains("sudo apt-get install redis-server"),
            "{message}"
        );
        assert!(message.contains("brew install redis"), "{message}");
        assert!(message.contains("REDIS_SERVER"), "{message}");

        let err = find_redis_server(None, Some(OsString::from("/nonexistent-dir"))).unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));
        let err = find_redis_server(None, None).unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));
        // A directory is not an executable.
        let err = find_redis_server(Some(OsString::from("/tmp")), None).unwrap_err();
        assert!(matches!(err, HarnessError::NotInstalled));

        // The real one is found through PATH, or REDIS_SERVER as a name.
        let found = redis_server_binary().unwrap();
        assert!(is_executable(&found));
        let dir = found.parent().unwrap().as_os_str().to_owned();
        let name = found.file_name().unwrap().to_owned();
        assert_eq!(
            find_redis_server(Some(name), Some(dir.clone())).unwrap(),
            found
        );
        assert_eq!(find_redis_server(None, Some(dir)).unwrap(), found);
    }

    #[test]
    fn early_exit_is_not_ready_with_log_tail() {
        let Some(false_bin) = search_path(OsStr::new("false"), std::env::var_os("PATH").as_deref())
        else {
            return;
        };
        let err = Cluster::launch(false_bin, 2, false).unwrap_err();
        let HarnessError::NotReady {
            node,
            reason,
            log,
            log_tail,
            ..
        } = &err
        else {
            panic!("expected NotReady, got {err:?}");
        };
        assert!(node.starts_with("127.0.0.1:"), "{node}");
        assert!(reason.contains("exited early"), "{reason}");
        assert!(log_tail.contains("no log"), "{log_tail}");
        // The cluster's directory was removed on the way out.
        assert!(!log.parent().unwrap().exists());
        let message = err.to_string();
        assert!(message.contains("did not become ready"), "{message}");
    }

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

    fn cluster_and_proxy() -> (Cluster, Proxy) {
        let cluster = Cluster::start(1).unwrap();
        let proxy =
            Proxy::start(&format!("127.0.0.1:{}", cluster.node(0).port().unwrap())).unwrap();
        (cluster, proxy)
    }

    #[test]
    fn proxy_none_forwards() {
        let (cluster, proxy) = cluster_and_proxy();
        assert_eq!(proxy.fault(), Fault::None);
        assert_eq!(proxy.addr().ip(), std::net::Ipv4Addr::LOCALHOST);
        assert_eq!(proxy.url(), format!("redis://{}", proxy.addr()));
        assert_eq!(ping_tcp(proxy.addr(), SHORT).unwrap(), "+PONG");

        let client = redis::Client::open(proxy.url()).unwrap();
        let mut con = client.get_connection_with_timeout(SHORT).unwrap();
        redis::cmd("SET").arg("k").arg("v").exec(&mut con).unwrap();
        assert_eq!(cluster.node(0).get("k").unwrap().as_deref(), Some("v"));

        // A big value goes through unharmed in both directions.
        let big: String = (0..200_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        redis::cmd("SET")
            .arg("big")
            .arg(&big)
            .exec(&mut con)
            .unwrap();
        let back: String = redis::cmd("GET").arg("big").query(&mut con).unwrap();
        assert_eq!(back, big);

        // Also with a redis:// prefixed target.
        let proxy2 = Proxy::start(&cluster.node(0).url()).unwrap();
        assert_eq!(ping_tcp(proxy2.addr(), SHORT).unwrap(), "+PONG");
    }

    #[test]
    fn proxy_partition_silences_but_keeps_connections() {
        let (_cluster, proxy) = cluster_and_proxy();
        let mut open = tcp(proxy.addr(), SHORT).unwrap();
        assert_eq!(ping_over(&mut open).unwrap(), "+PONG");

        proxy.set_fault(Fault::Partition);
        assert_eq!(proxy.fault(), Fault::Partition);
        let err = ping_over(&mut open).unwrap_err();
        assert!(is_timeout(&err), "expected a timeout, got {err:?}");
        // Still open: another wait times out again instead of seeing EOF.
        let err = read_line(&mut open).unwrap_err();
        assert!(is_timeout(&err), "expected a timeout, got {err:?}");
        // New connections are accepted and held, silently.
        let mut held = tcp(proxy.addr(), SHORT).unwrap();
        let err = ping_over(&mut held).unwrap_err();
        assert!(is_timeout(&err), "expected a timeout, got {err:?}");

        proxy.set_fault(Fault::None);
        assert_eq!(ping_tcp(proxy.addr(), SHORT).unwrap(), "+PONG");
        // The old connection lost its PINGs but forwards again.
        assert_eq!(ping_over(&mut open).unwrap(), "+PONG");
    }

    #[test]
    fn proxy_partition_with_target_down_holds_connections() {
        let (cluster, proxy) = cluster_and_proxy();
        cluster.node(0).kill().unwrap();
        proxy.set_fault(Fault::Partition);
        let mut held = tcp(proxy.addr(), SHORT).unwrap();
        let err = ping_over(&mut held).unwrap_err();
        assert!(is_timeout(&err), "expected a timeout, got {err:?}");
        proxy.set_fault(Fault::None);
        // The target is down: now the connection gets closed.
        held.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        match held.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("unexpected bytes {:?}", &buf[..n]),
            Err(e) => assert!(!is_timeout(&e), "expected EOF or reset, got {e:?}"),
        }
    }

    fn assert_closed(result: io::Result<String>) {
        match result {
            Ok(line) => panic!("expected EOF or reset, got {line:?}"),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::BrokenPipe
                ),
                "expected EOF or reset, got {e:?}"
            ),
        }
    }

    #[test]
    fn proxy_reset_closes_connections() {
        let (_cluster, proxy) = cluster_and_proxy();
        let mut open = tcp(proxy.addr(), SHORT).unwrap();
        assert_eq!(ping_over(&mut open).unwrap(), "+PONG");

        proxy.set_fault(Fault::Reset);
        assert_closed(ping_over(&mut open));
        // New connections are closed right after accept.
        match tcp(proxy.addr(), SHORT) {
            Ok(mut fresh) => assert_closed(ping_over(&mut fresh)),
            Err(e) => assert!(!is_timeout(&e), "{e:?}"),
        }
        let client = redis::Client::open(proxy.url()).unwrap();
        assert!(client.get_connection_with_timeout(SHORT).is_err());

        proxy.set_fault(Fault::None);
        assert_eq!(ping_tcp(proxy.addr(), SHORT).unwrap(), "+PONG");
    }

    #[test]
    fn proxy_delay_costs_two_delays_per_round_trip() {
        let (_cluster, proxy) = cluster_and_proxy();
        let mut stream = tcp(proxy.addr(), Duration::from_secs(2)).unwrap();
        assert_eq!(ping_over(&mut stream).unwrap(), "+PONG");

        proxy.set_fault(Fault::Delay(Duration::from_millis(20)));
        let started = Instant::now();
        assert_eq!(ping_over(&mut stream).unwrap(), "+PONG");
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(40), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");

        // Delays do not accumulate: five requests written 10 ms apart under a
        // 100 ms delay are all answered about 2 x 100 ms after the last one
        // was written (serial per-chunk sleeping would take 600 ms or more).
        proxy.set_fault(Fault::Delay(Duration::from_millis(100)));
        stream.set_nodelay(true).unwrap();
        let started = Instant::now();
        for i in 0..5 {
            stream
                .write_all(format!("ECHO m{i}\r\n").as_bytes())
                .unwrap();
            thread::sleep(Duration::from_millis(10));
        }
        for i in 0..5 {
            assert_eq!(read_line(&mut stream).unwrap(), "$2");
            assert_eq!(read_line(&mut stream).unwrap(), format!("m{i}"));
        }
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");
    }

    #[test]
    fn proxy_delay_preserves_order_and_bytes() {
        let (cluster, proxy) = cluster_and_proxy();
        proxy.set_fault(Fault::Delay(Duration::from_millis(3)));
        let client = redis::Client::open(proxy.url()).unwrap();
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut pipe = redis::pipe();
        for i in 0..300 {
            pipe.cmd("RPUSH").arg("list").arg(i);
        }
        let _: Vec<i64> = pipe.query(&mut con).unwrap();
        let big = "x".repeat(300_000);
        redis::cmd("SET")
            .arg("big")
            .arg(&big)
            .exec(&mut con)
            .unwrap();
        let back: String = redis::cmd("GET").arg("big").query(&mut con).unwrap();
        assert_eq!(back.len(), big.len());
        assert_eq!(back, big);
        // Switching the fault mid-stream keeps the order.
        proxy.set_fault(Fault::None);
        let list: Vec<i64> = redis::cmd("LRANGE")
            .arg("list")
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        assert_eq!(list, (0..300).collect::<Vec<i64>>());
        assert_eq!(
            cluster.node(0).query(&["LLEN", "list"]).unwrap(),
            redis::Value::Int(300)
        );
    }

    #[test]
    fn proxy_follows_target_restart_and_drop_joins_threads() {
        let (cluster, proxy) = cluster_and_proxy();
        let mut open = tcp(proxy.addr(), SHORT).unwrap();
        assert_eq!(ping_over(&mut open).unwrap(), "+PONG");
        // The target dies: the proxied connection sees EOF.
        cluster.node(0).kill().unwrap();
        open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(open.read(&mut buf).unwrap(), 0);
        cluster.node(0).start().unwrap();
        assert_eq!(ping_tcp(proxy.addr(), SHORT).unwrap(), "+PONG");

        // Idle and partitioned connections are open when the proxy drops.
        let _idle = tcp(proxy.addr(), SHORT).unwrap();
        proxy.set_fault(Fault::Partition);
        let mut held = tcp(proxy.addr(), SHORT).unwrap();
        let _ = ping_over(&mut held);
        thread::sleep(Duration::from_millis(20));
        let weak = Arc::downgrade(&proxy.shared);
        let started = Instant::now();
        drop(proxy);
        let took = started.elapsed();
        assert!(
            weak.upgrade().is_none(),
            "a proxy thread outlived the proxy"
        );
        assert!(took < Duration::from_millis(500), "{took:?}");
        // Held connections were closed.
        held.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        match held.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("unexpected bytes {:?}", &buf[..n]),
            Err(e) => assert!(!is_timeout(&e), "expected EOF or reset, got {e:?}"),
        }
    }

    #[test]
    fn cluster_proxies_in_node_order() {
        let cluster = Cluster::start(3).unwrap();
        let proxies = cluster.proxies().unwrap();
        assert_eq!(proxies.len(), 3);
        for (i, proxy) in proxies.iter().enumerate() {
            let client = redis::Client::open(proxy.url()).unwrap();
            let mut con = client.get_connection_with_timeout(SHORT).unwrap();
            redis::cmd("SET").arg("who").arg(i).exec(&mut con).unwrap();
            assert_eq!(cluster.node(i).get("who").unwrap(), Some(i.to_string()));
        }
        proxies[1].set_fault(Fault::Partition);
        assert_eq!(proxies[0].fault(), Fault::None);
        assert_eq!(proxies[1].fault(), Fault::Partition);
    }
}
