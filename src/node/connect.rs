//! Opening a node's connection within the round's deadline. Resolve the
//! host, connect (TCP, Unix socket, or TLS through the `redis` crate), then
//! one pipelined handshake. It sends `AUTH`, `SELECT`, `SCRIPT LOAD`,
//! `INFO server`, and any clean-ups the node is owed.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use redis::Value;

use super::endpoint::Route;
use super::resolve::Resolver;
use super::restart_guard;
use super::transport::{connect_failure, Reader, Stream, Writer};
use super::{Bounds, Node};
use crate::error::{server_error_text, Failure, NodeError};
use crate::store::script;

/// A new connection, its handshake done: its writer, its reading half
/// (none when unsplit, as the writer reads), and the bits of our scripts
/// the server has (`SCRIPT LOAD` went through).
pub(super) type Opened = (Writer, Option<Reader>, u8);

impl Node {
    /// [`connect`](Self::connect) within `bounds`, or fail at once within
    /// the reconnect backoff. A timeout starts the backoff; the caller
    /// records it.
    pub(super) fn connect_unless_backing_off(
        &self,
        connect_after: Option<Instant>,
        bounds: Bounds,
    ) -> Result<Opened, Failure> {
        let now = Instant::now();
        let wait = connect_after.unwrap_or(now).saturating_duration_since(now);
        if !wait.is_zero() {
            return Err(Failure::Error(NodeError::Connect(format!(
                "a connect timed out; not trying again for {wait:?}"
            ))));
        }
        // No time left to try: a timeout of the round, not of this node.
        time_left(bounds.deadline)?;
        match self.connect(bounds.deadline, bounds.connect_timeout) {
            Err(Failure::TimedOut) => Err(Failure::ConnectTimedOut),
            opened => opened,
        }
    }

    /// Opens a new connection, authenticates, selects the db and loads our
    /// scripts, all within `connect_timeout` and never past `deadline`.
    pub(super) fn connect(
        &self,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Opened, Failure> {
        let limit = time_left(deadline)?.min(connect_timeout);
        // The handshake is part of the connect, within the same bound.
        let deadline = Instant::now() + limit;
        let (mut writer, mut reader) = match &self.endpoint.route {
            Route::Ip(addr) => Stream::tcp(addr, limit)?.split()?,
            Route::Name(resolver) => self.connect_resolved(resolver, limit)?.split()?,
            #[cfg(unix)]
            Route::Unix(path) => Stream::unix(path)?.split()?,
            Route::Unsplit => (self.connect_unsplit(limit)?, None),
        };
        let mut recv = |writer: &mut Writer| match &mut reader {
            Some(r) => r.recv(deadline),
            None => writer.recv(deadline),
        };
        let (owed, owed_ids) = self.owed.due();
        let hello = [&self.endpoint.handshake[..], &owed].concat();
        writer.send(&hello, deadline)?;
        let mut scripts = script::SCRIPTS.iter().fold(0u8, |bits, s| bits | s.bit);
        let (checked, loads) = (self.endpoint.checked_replies, script::SCRIPTS.len());
        // The last handshake reply is INFO server: the restarted-node guard,
        // then one vote per server process.
        let mut info = Value::Nil;
        for i in 0..=checked + loads {
            info = recv(&mut writer)?;
            if let Value::ServerError(e) = &info {
                // A full server turns the connection away before it reads
                // anything: that error is not an answer to our AUTH. (An
                // unauthenticated INFO: the owed clean-ups did not run either.)
                let refused_auth = i == 0 && self.endpoint.sends_auth && !is_server_full(e);
                if refused_auth || is_auth_error(e) {
                    return Err(Failure::Error(NodeError::Auth {
                        node: self.endpoint.name.to_string(),
                        reply: server_error_text(e),
                        hint: self.endpoint.auth_hint,
                    }));
                }
                if i < checked {
                    return Err(Failure::Error(NodeError::Connect(server_error_text(e))));
                }
                // SCRIPT LOAD refused (an ACL, say): scripts go as EVAL.
                if i < checked + loads {
                    scripts = 0;
                }
            }
        }
        // The owed clean-ups' replies: whatever they say, they ran.
        for _ in &owed_ids {
            recv(&mut writer)?;
        }
        self.owed.settle(&owed_ids);
        if let Some(grace) = self.restart_grace {
            restart_guard::check(&info, grace, &self.endpoint.restarts).map_err(Failure::Error)?;
        }
        self.servers
            .claim(&info, self.index, &self.endpoint.name)
            .map_err(Failure::Error)?;
        Ok((writer, reader, scripts))
    }

    /// Connects through the `redis` crate (TLS), within `limit`.
    fn connect_unsplit(&self, limit: Duration) -> Result<Writer, Failure> {
        // rustls panics when no crypto provider was selected. A panic here
        // would leave this node's roles taken: make it a failure.
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.endpoint.client.get_connection_with_timeout(limit)
        }))
        .map_err(|_| {
            Failure::Error(NodeError::Connect(
                "the TLS library panicked while connecting; with the `tls` feature, \
                 select a rustls crypto provider (rustls = { version = \"0.23\", \
                 features = [\"ring\"] }, or CryptoProvider::install_default)"
                    .to_string(),
            ))
        })?
        .map(|inner| Writer::Unsplit(inner, [None; 2]))
        .map_err(connect_failure)
    }

    /// Resolves the node's host name, then connects to its addresses in turn, all within `limit`.
    fn connect_resolved(&self, resolver: &Resolver, limit: Duration) -> Result<Stream, Failure> {
        let deadline = Instant::now() + limit;
        let addrs = resolver.resolve(limit)?;
        let mut last = Failure::TimedOut;
        for (i, addr) in addrs.iter().enumerate() {
            match Stream::tcp(addr, share(time_left(deadline)?, addrs.len() - i)) {
                Ok(stream) => return Ok(stream),
                Err(failure) => last = failure,
            }
        }
        Err(last)
    }
}

/// Whether an error reply says the connection is not authenticated, or
/// the credentials were wrong (whatever command it answers).
fn is_auth_error(e: &redis::ServerError) -> bool {
    matches!(e.code(), "NOAUTH" | "WRONGPASS")
}

/// Whether an error reply is the server turning a new connection away
/// because it has `maxclients` connections already.
fn is_server_full(e: &redis::ServerError) -> bool {
    e.details()
        .is_some_and(|details| details.starts_with("max number of clients reached"))
}

/// How long to try the next of `remaining` addresses: an equal share of
/// `left`. An address that never answers (a dead IPv6 route) leaves time
/// for the rest.
fn share(left: Duration, remaining: usize) -> Duration {
    left / u32::try_from(remaining.max(1)).unwrap_or(u32::MAX)
}

/// Time left until `deadline`, or a timeout if none is.
fn time_left(deadline: Instant) -> Result<Duration, Failure> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left).ok_or(Failure::TimedOut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_gets_an_equal_share_of_the_time_left_and_the_last_gets_all() {
        let left = Duration::from_millis(90);
        assert_eq!(share(left, 3), Duration::from_millis(30));
        assert_eq!(share(left, 1), left);
        assert_eq!(share(left, 0), left);
    }
}
