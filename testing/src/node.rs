//! One server the tests drive: kill (SIGKILL), pause (SIGSTOP), resume
//! (SIGCONT), start again on the same address, and inspect over a fresh
//! connection. The process handle is behind a mutex so that every method
//! takes `&self` and any thread may fault a node while others use it.

use std::io;
use std::path::PathBuf;
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use super::process;
use super::spawn::{Address, Listen, Spawner, MAX_SOCKET_PATH};
use super::{io_error, lock, HarnessError, CONNECT_TIMEOUT, IO_TIMEOUT};

/// How long `pause`/`resume` wait for the process state to change (Linux).
const SIGNAL_SETTLE: Duration = Duration::from_secs(1);

/// How long a node may take to save and exit on `SHUTDOWN SAVE`.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// One `redis-server` of a [`Cluster`](super::Cluster).
///
/// Every method takes `&self` (the process handle sits behind a mutex), so a
/// node can be killed, paused or restarted from any thread while others use
/// it. The address never changes: [`Node::start`] and [`Node::restart`] come
/// back on the same port or socket path. A killed or restarted node has
/// lost all its data, unless it is restarted with
/// [`Node::restart_persisted`] or its cluster has persistence
/// ([`Cluster::start_persistent`](super::Cluster::start_persistent)).
///
/// ```
/// use redlock_sync_testing::Cluster;
///
/// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
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
    pub(super) fn launch(spawner: Spawner, listen: Listen) -> Result<Node, HarnessError> {
        let (child, address) = if listen == Listen::Unix {
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
            spawner.launch_on_fresh_port(listen == Listen::Tls)?
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

    /// The node's URL: `redis://127.0.0.1:PORT`,
    /// `redis+unix:///path/to/node-<i>.sock`, or for a node of
    /// [`Cluster::start_tls`](super::Cluster::start_tls)
    /// `rediss://127.0.0.1:PORT`. Stable across restarts.
    pub fn url(&self) -> String {
        self.address.url()
    }

    /// The TCP port of [`url`](Self::url) (of a TLS node, its TLS port),
    /// or `None` for a Unix-socket node.
    pub fn port(&self) -> Option<u16> {
        match self.address {
            Address::Tcp(port) | Address::Tls { tls_port: port, .. } => Some(port),
            Address::Unix(_) => None,
        }
    }

    /// Whether the node speaks TLS to clients (see
    /// [`Cluster::start_tls`](super::Cluster::start_tls)).
    pub fn is_tls(&self) -> bool {
        matches!(self.address, Address::Tls { .. })
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
    /// forgets all its data, unless its cluster has persistence
    /// ([`Cluster::start_persistent`](super::Cluster::start_persistent)):
    /// then it keeps every write it acknowledged.
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

    pub(super) fn kill_quietly(&self) {
        let _ = self.kill();
    }

    /// Freezes the server with SIGSTOP (`kill -STOP <pid>`): connections stay
    /// open but nothing is answered until [`Node::resume`]. On Linux this
    /// returns once the process is actually stopped.
    ///
    /// ```
    /// use redlock_sync_testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
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
        process::send_signal("STOP", pid)?;
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
        process::send_signal("CONT", pid)?;
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
    /// The data is gone, unless the cluster has persistence
    /// ([`Cluster::start_persistent`](super::Cluster::start_persistent)):
    /// then the node loads every write it acknowledged before it answers.
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

    /// Restarts the server with its data, as a node with persistence does
    /// (`appendonly yes`, `appendfsync always`): it saves its data set and
    /// exits (`SHUTDOWN SAVE`, so no write falls between the two), then
    /// starts again on the same address, loads it, and answers `PING`.
    /// Keys keep their expiry times, so the time it was down counts. The
    /// saved file is removed once loaded: a later [`kill`](Self::kill) or
    /// [`restart`](Self::restart) still loses everything, on a node without
    /// persistence.
    ///
    /// ```
    /// use redlock_sync_testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
    /// let cluster = Cluster::start(1)?;
    /// let node = cluster.node(0);
    /// node.set("k", "v")?;
    /// node.restart_persisted()?;
    /// assert_eq!(node.get("k")?.as_deref(), Some("v"));
    /// node.restart()?;
    /// assert_eq!(node.get("k")?, None);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] if the node is not running or does not exit
    /// within a few seconds of `SHUTDOWN SAVE`; else as for
    /// [`Node::restart`].
    pub fn restart_persisted(&self) -> Result<(), HarnessError> {
        let mut state = lock(&self.state);
        let describe = || format!("restarting node {} with its data", self.address.describe());
        let Some(child) = state.child.as_mut() else {
            let stopped = io::Error::new(io::ErrorKind::NotConnected, "the node is not running");
            return Err(io_error(describe(), stopped));
        };
        // The server exits before it answers: no reply comes.
        let _ = self.run::<()>(redis::cmd("SHUTDOWN").arg("SAVE"), "SHUTDOWN SAVE");
        let start = std::time::Instant::now();
        while child
            .try_wait()
            .map_err(|e| io_error(describe(), e))?
            .is_none()
        {
            if start.elapsed() > SHUTDOWN_WAIT {
                let slow = io::Error::new(io::ErrorKind::TimedOut, "SHUTDOWN SAVE did not end it");
                return Err(io_error(describe(), slow));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Self::kill_locked(&mut state)?;
        self.start_locked(&mut state)?;
        let saved = self.spawner.dir.join(self.spawner.rdb_name());
        std::fs::remove_file(&saved).map_err(|e| io_error(describe(), e))
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
        let url = self.address.plain_url();
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
            context: format!("{what} on {}", self.address.plain_url()),
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
    /// use redlock_sync_testing::Cluster;
    ///
    /// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
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

/// Waits (bounded) until `/proc` reports the process stopped or not stopped,
/// so that `pause` / `resume` are in effect when they return. A no-op where
/// there is no `/proc`.
fn settle(pid: u32, stopped: bool) {
    process::wait_until(pid, SIGNAL_SETTLE, |state| match state {
        Some(state) => matches!(state, 'T' | 't') == stopped,
        None => true,
    });
}

#[cfg(test)]
mod tests {
    use super::super::spawn::SAME_ADDRESS_RETRY;
    use super::super::test_support::*;
    use super::super::Cluster;
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::thread;
    use std::time::Instant;

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
        assert_times_out(ping_over(&mut open));
        assert_times_out(ping_tcp(addr, SHORT));
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
}
