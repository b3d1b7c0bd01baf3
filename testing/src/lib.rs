//! Throwaway **real** `redis-server` processes for tests, examples and
//! benchmarks, plus a fault-injecting TCP [`Proxy`]: the test harness of
//! [`redlock-sync`](https://docs.rs/redlock-sync) and its `redlock` tool,
//! for your own tests of code that locks over independent Redis (or Valkey)
//! masters. Take it as a dev-dependency:
//!
//! ```toml
//! [dev-dependencies]
//! redlock-sync-testing = "0.1"
//! ```
//!
//! * [`Cluster::start`] / [`Cluster::start_unix`] start `n` independent
//!   `redis-server` masters (no replication, no persistence) listening on
//!   `127.0.0.1` or on Unix sockets, each in a private temporary directory;
//!   [`Cluster::start_tls`] starts masters that speak TLS, with a throwaway
//!   certificate authority. [`Cluster::start_persistent`] starts masters
//!   with persistence (`appendonly yes`, `appendfsync always`).
//! * Every [`Node`] can be killed ([`Node::kill`], SIGKILL: the node forgets
//!   everything, unless it has persistence), started again on the same
//!   address ([`Node::start`], [`Node::restart`]), frozen ([`Node::pause`],
//!   SIGSTOP: connections hang) and thawed ([`Node::resume`]), and
//!   inspected ([`Node::get`], [`Node::pttl`], [`Node::keys`],
//!   [`Node::query`], ...).
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
//! # Example
//!
//! A test starts three masters, kills one, and slows another down through a
//! proxy (the crate's client here is the `redis` crate; a test of
//! `redlock-sync` gives its `Redlock` the URLs instead):
//!
//! ```
//! use std::time::{Duration, Instant};
//! use redlock_sync_testing::{Cluster, Fault, Proxy};
//!
//! # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
//! let cluster = Cluster::start(3)?;
//! assert_eq!(cluster.len(), 3);
//! cluster.node(0).set("greeting", "hello")?;
//! assert_eq!(cluster.node(0).get("greeting")?.as_deref(), Some("hello"));
//!
//! // Kill one master: it becomes unreachable ...
//! cluster.node(0).kill()?;
//! assert!(cluster.node(0).get("greeting").is_err());
//! // ... and comes back on the same address, empty.
//! cluster.node(0).start()?;
//! assert_eq!(cluster.node(0).get("greeting")?, None);
//!
//! // Delay every byte to and from node 1 by 100 ms, while connected.
//! let port = cluster.node(1).port().expect("a TCP node");
//! let proxy = Proxy::start(&format!("127.0.0.1:{port}"))?;
//! let client = redis::Client::open(proxy.url()).unwrap();
//! let mut con = client.get_connection().unwrap();
//! proxy.set_fault(Fault::Delay(Duration::from_millis(100)));
//! let start = Instant::now();
//! let _: String = redis::cmd("PING").query(&mut con).unwrap();
//! assert!(start.elapsed() >= Duration::from_millis(200)); // there and back
//! proxy.set_fault(Fault::None);
//! # Ok(())
//! # }
//! ```
//!
//! # A time bound for every test binary
//!
//! A test that hangs while its servers run would hold CI until CI's own
//! limit, and leave the servers behind. So the first cluster a process
//! starts arms a time bound, [`DEFAULT_TIME_BOUND`] (300 s) unless the
//! environment variable [`TIME_BOUND_VAR`] (`REDLOCK_SYNC_TEST_TIMEOUT`)
//! gives another number of seconds (`0`: no bound). Once the bound has
//! passed the process, still running:
//!
//! 1. prints to its stderr that it ran past its bound, with each cluster
//!    still up: its size, its age, and the thread that started it, which
//!    under `cargo test` is named after the test;
//! 2. kills every server of its clusters (on Linux: through the records
//!    described below, as for a killed run);
//! 3. exits with status [`TIMED_OUT_STATUS`] (124, as `timeout(1)`).
//!
//! The bound covers the whole process (a test binary: all its tests), from
//! its first cluster on; set it well above the binary's usual time. A test
//! that holds no cluster is not bounded unless a cluster started before it
//! in the same process.
//!
//! # Cleaning up after a killed run
//!
//! A run killed before its clusters dropped (`kill -TERM` or `kill -KILL` of
//! a test binary or an example; Ctrl-C in a terminal also stops the servers,
//! which share its process group) would leave servers running and folders
//! behind. So on Linux every cluster keeps a record (its owner's pid and
//! start time, its folder, its servers' pids and start times) in
//! `redlock-sync-records-<uid>` under the temporary directory, and every
//! [`Cluster::start`] first stops the servers of clusters whose owner is
//! gone and removes their folders. It kills by pid, and only a process that
//! is still that cluster's server: same start time, working in that
//! cluster's folder, running the recorded binary; never by name. Servers of
//! a killed run thus live until the next run of the harness starts a
//! cluster.
//!
//! # Requirements
//!
//! `redis-server` (Redis 6 or later, or a compatible server such as Valkey)
//! must be installed: it is looked up in the `REDIS_SERVER` environment
//! variable (a path, or a program name searched on `PATH`), else as
//! `redis-server` on `PATH`; `REDIS_SERVER` may name a `valkey-server` too
//! (tried with Redis 6.2 and 7.0 and Valkey 9). When it cannot be found the
//! harness returns [`HarnessError::NotInstalled`], whose message says how to
//! install Redis and how to set `REDIS_SERVER`; it never skips silently.
//! Pausing and resuming use the `kill` program (for `kill -STOP` /
//! `kill -CONT`), TLS clusters the `openssl` program (a missing one is a
//! [`HarnessError::Io`] that says how to install it), and the crate builds
//! on Unix-like systems only.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

// One file per concept, from the bottom up: finding the binary, a process by
// its pid, the records that let a later run reap a killed run's servers,
// spawning one server, a node the tests drive, a cluster of nodes, the
// fault proxy, and the time bound.
mod binary;
mod certs;
mod cluster;
mod node;
mod process;
mod proxy;
mod record;
mod spawn;
#[cfg(test)]
mod test_support;
mod watchdog;

pub use cluster::Cluster;
pub use node::Node;
pub use proxy::{Fault, Proxy};
pub use watchdog::{DEFAULT_TIME_BOUND, TIMED_OUT_STATUS, TIME_BOUND_VAR};

/// Connect timeout of the inspection helpers (and of the proxy's upstream
/// connections).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Read/write timeout of the inspection helpers.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No server binary: `redis-server` is not on `PATH`, or `REDIS_SERVER`
    /// names nothing that runs. The message says how to install Redis and
    /// how to point the harness at another binary.
    #[error(
        "{searched}: install Redis (Debian/Ubuntu: `sudo apt-get install redis-server`; \
         macOS: `brew install redis`), or set REDIS_SERVER to the server binary to run, \
         a path or a name found on PATH, which may be a valkey-server \
         (for example REDIS_SERVER=/usr/local/bin/valkey-server)"
    )]
    NotInstalled {
        /// Where the harness looked: `redis-server` on `PATH`, or what
        /// `REDIS_SERVER` names and why it does not do.
        searched: String,
    },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Cluster>();
        check::<Node>();
        check::<Proxy>();
        check::<HarnessError>();
    }
}

/// The README's code blocks, compiled as doctests, so that `cargo test`
/// fails when the README and the API part ways.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
