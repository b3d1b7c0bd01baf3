//! One node: its address, a pool of idle connections, and the connection
//! itself, which is thrown away on any error or timeout.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value};

use crate::error::{ConfigError, NodeError};
use crate::restart_guard;
use crate::script::pack;

/// Idle connections kept per node; more than this many at once are closed
/// when handed back.
const MAX_IDLE: usize = 64;

/// Why one exchange with a node did not produce a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The round's deadline passed first.
    TimedOut,
    /// Anything else.
    Error(NodeError),
}

/// One Redis master.
pub(crate) struct Node {
    /// `host:port` or the socket path; never the password.
    name: String,
    /// What makes two nodes the same server: the address without the db.
    identity: String,
    /// Address only: no password, no db, no `CLIENT SETINFO`; we do the
    /// handshake ourselves, against the round's deadline.
    client: redis::Client,
    /// `AUTH` and `SELECT`, packed, if the URL asks for them.
    handshake: Vec<u8>,
    handshake_replies: usize,
    idle: Mutex<Vec<Conn>>,
    /// The restarted-node guard: with a grace period, `INFO server` is the
    /// handshake's last command, and a node up for less does not vote.
    restart_grace: Option<Duration>,
}

impl Node {
    /// Parses a node URL: `redis://`, `redis+unix://`, or (with the `tls`
    /// feature) `rediss://`; user, password and db as the redis crate reads
    /// them.
    pub(crate) fn parse(url: &str) -> Result<Node, ConfigError> {
        let bad = |reason: String| ConfigError::NodeUrl {
            url: redact(url),
            reason,
        };
        let scheme = url.split("://").next().unwrap_or("");
        if !matches!(scheme, "redis" | "rediss" | "redis+unix" | "unix") || !url.contains("://") {
            return Err(bad(
                "expected redis://host:port[/db], redis+unix:///path, or rediss://host:port"
                    .to_string(),
            ));
        }
        if scheme == "rediss" && !cfg!(feature = "tls") {
            return Err(bad(
                "rediss:// needs the crate's `tls` feature: redlock-sync = { features = [\"tls\"] }"
                    .to_string(),
            ));
        }
        let info: ConnectionInfo = url.into_connection_info().map_err(|e| bad(e.to_string()))?;
        let redis = info.redis_settings();
        let (name, identity) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let n = format!("{host}:{port}");
                (n.clone(), format!("tcp {}", n.to_ascii_lowercase()))
            }
            ConnectionAddr::TcpTls { host, port, .. } => {
                let n = format!("{host}:{port}");
                (
                    format!("tls {n}"),
                    format!("tcp {}", n.to_ascii_lowercase()),
                )
            }
            ConnectionAddr::Unix(path) => {
                let n = path.display().to_string();
                (n.clone(), format!("unix {n}"))
            }
            other => return Err(bad(format!("unsupported address {other:?}"))),
        };
        let mut handshake = Vec::new();
        let mut handshake_replies = 0;
        if let Some(password) = redis.password() {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = redis.username() {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            pack(&mut handshake, &args);
            handshake_replies += 1;
        }
        if redis.db() != 0 {
            pack(
                &mut handshake,
                &[b"SELECT", redis.db().to_string().as_bytes()],
            );
            handshake_replies += 1;
        }
        let bare = info
            .clone()
            .set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name())
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(bare).map_err(|e| bad(e.to_string()))?;
        Ok(Node {
            name,
            identity,
            client,
            handshake,
            handshake_replies,
            idle: Mutex::new(Vec::new()),
            restart_grace: None,
        })
    }

    /// Turns the restarted-node guard on (a zero grace leaves it off): every
    /// new connection reads the server's uptime with `INFO server`,
    /// pipelined with the handshake, and fails with
    /// [`NodeError::Restarted`] while the uptime is below `grace`.
    pub(crate) fn guard_restarts(&mut self, grace: Duration) {
        if !grace.is_zero() && self.restart_grace.is_none() {
            self.handshake
                .extend_from_slice(&restart_guard::info_server());
            self.handshake_replies += 1;
        }
        self.restart_grace = Some(grace).filter(|g| !g.is_zero());
    }

    /// The node's address for people: `host:port` or the socket path.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Two nodes with the same identity are the same server.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// An idle connection, if there is one.
    pub(crate) fn checkout(&self) -> Option<Conn> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Hands back a connection that completed its exchange cleanly.
    pub(crate) fn checkin(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// A connection failed: the idle ones are suspect too (the server may
    /// have restarted or gone away), so close them all; later rounds
    /// reconnect.
    pub(crate) fn discard_idle(&self) {
        let stale = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        drop(stale);
    }

    /// Opens a new connection, authenticates and selects the db, all within
    /// `connect_timeout` and never past `deadline`.
    pub(crate) fn connect(
        &self,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Conn, Failure> {
        let left = time_left(deadline)?;
        let connection = self
            .client
            .get_connection_with_timeout(left.min(connect_timeout))
            .map_err(|e| {
                if is_timeout(&e) {
                    Failure::TimedOut
                } else {
                    Failure::Error(NodeError::Connect(e.to_string()))
                }
            })?;
        let mut conn = Conn {
            inner: connection,
            scripts: 0,
        };
        let mut last = Value::Nil;
        if self.handshake_replies > 0 {
            conn.send(&self.handshake, deadline)?;
            for _ in 0..self.handshake_replies {
                match conn.recv(deadline)? {
                    Value::ServerError(e) => {
                        return Err(Failure::Error(NodeError::Connect(format!(
                            "{} {}",
                            e.code(),
                            e.details().unwrap_or("")
                        ))))
                    }
                    value => last = value,
                }
            }
        }
        // The restarted-node guard: the last handshake reply is INFO server.
        if let Some(grace) = self.restart_grace {
            restart_guard::check(&last, grace).map_err(Failure::Error)?;
        }
        Ok(conn)
    }
}

/// One open connection, owned by one round at a time.
pub(crate) struct Conn {
    inner: redis::Connection,
    /// Bits of the scripts known to be cached on this connection's server.
    pub(crate) scripts: u8,
}

impl Conn {
    /// Writes `bytes`, giving up at `deadline`.
    pub(crate) fn send(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), Failure> {
        let left = time_left(deadline)?;
        self.inner
            .set_write_timeout(Some(left))
            .and_then(|()| self.inner.send_packed_command(bytes))
            .map_err(io_failure)
    }

    /// Reads one reply, giving up at `deadline`.
    ///
    /// Replies are read one node after another, so a silent node can use up
    /// the round's time before the others' replies, which arrived long ago,
    /// are read. Past the deadline a read therefore still collects a reply
    /// that is already here: its timeout is the smallest the OS offers (a
    /// reply in the buffer returns at once; a silent node costs one
    /// scheduler tick at most).
    pub(crate) fn recv(&mut self, deadline: Instant) -> Result<Value, Failure> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(1));
        self.inner
            .set_read_timeout(Some(left))
            .and_then(|()| self.inner.recv_response())
            .map_err(io_failure)
    }
}

/// Time left until `deadline`, or a timeout if none is.
fn time_left(deadline: Instant) -> Result<Duration, Failure> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(Failure::TimedOut)
    } else {
        Ok(left)
    }
}

fn is_timeout(e: &redis::RedisError) -> bool {
    e.is_timeout()
}

fn io_failure(e: redis::RedisError) -> Failure {
    if is_timeout(&e) {
        Failure::TimedOut
    } else {
        Failure::Error(NodeError::Io(e.to_string()))
    }
}

/// The URL with any password replaced by `***`, for error messages.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    // The last '@' anywhere, not only in the authority: a password may hold
    // a raw '/', '?' or '#', and the error for that malformed URL must
    // still hide it.
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("redis://alice:s3cret@h:1/2"),
            "redis://alice:***@h:1/2"
        );
        assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact("no scheme"), "no scheme");
        assert_eq!(redact("redis://:pa/ss@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://u:p?a#s@h:1/0"), "redis://u:***@h:1/0");
    }

    #[test]
    fn parse_reads_address_auth_and_db() {
        let node = Node::parse("redis://u:p@127.0.0.1:7001/3").unwrap();
        assert_eq!(node.name(), "127.0.0.1:7001");
        assert_eq!(node.handshake_replies, 2);
        let node = Node::parse("redis+unix:///tmp/x.sock").unwrap();
        assert_eq!(node.name(), "/tmp/x.sock");
        assert_eq!(node.handshake_replies, 0);
    }
}
