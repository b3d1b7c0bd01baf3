//! Host name resolution with a time bound.
//!
//! The standard library's lookup blocks with no timeout, but a connect must
//! not outlast its timeout. So the lookup runs on a helper thread, and the
//! connect waits at most the time it has. The next connect waits again for
//! a lookup still running. A hung resolver costs one thread per node, not
//! per round.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Failure, NodeError};
use crate::sync::lock;

/// What a lookup gives: the addresses, or why there are none.
type Answer = io::Result<Vec<SocketAddr>>;

/// Looks a host and port up (blocking).
type Lookup = fn(&str, u16) -> Answer;

/// Resolves one node's host name, one lookup at a time.
pub(crate) struct Resolver {
    host: String,
    port: u16,
    lookup: Lookup,
    /// A lookup that outlasted the connect that started it.
    running: Mutex<Option<Receiver<Answer>>>,
}

impl Resolver {
    /// A resolver for `host:port` through the system resolver.
    pub(crate) fn new(host: &str, port: u16) -> Resolver {
        Resolver {
            host: host.to_string(),
            port,
            lookup: system_lookup,
            running: Mutex::new(None),
        }
    }

    /// The host's addresses, waiting at most `limit` for them.
    pub(crate) fn resolve(&self, limit: Duration) -> Result<Vec<SocketAddr>, Failure> {
        let running = lock(&self.running).take();
        let answers = running.map_or_else(|| self.start(), Ok)?;
        let reason = match answers.recv_timeout(limit) {
            Ok(Ok(addrs)) if !addrs.is_empty() => return Ok(addrs),
            Ok(Ok(_)) => "no address".to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(RecvTimeoutError::Timeout) => {
                *lock(&self.running) = Some(answers);
                return Err(Failure::TimedOut);
            }
            Err(RecvTimeoutError::Disconnected) => "the lookup thread ended".to_string(),
        };
        let host = &self.host;
        Err(Failure::Error(NodeError::Connect(format!(
            "could not resolve {host}: {reason}"
        ))))
    }

    /// Starts a lookup on a helper thread.
    fn start(&self) -> Result<Receiver<Answer>, Failure> {
        let (send, answers) = mpsc::channel();
        let (host, port, lookup) = (self.host.clone(), self.port, self.lookup);
        std::thread::Builder::new()
            .name("redlock-sync resolver".to_string())
            .spawn(move || {
                // If nobody waits any more, the answer is dropped.
                let _ = send.send(lookup(&host, port));
            })
            .map_err(|e| {
                Failure::Error(NodeError::Connect(format!(
                    "could not start a thread to resolve {}: {e}",
                    self.host
                )))
            })?;
        Ok(answers)
    }
}

fn system_lookup(host: &str, port: u16) -> Answer {
    (host, port).to_socket_addrs().map(Iterator::collect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    #[test]
    fn a_name_resolves_through_the_system_resolver() {
        let addrs = Resolver::new("localhost", 6379)
            .resolve(Duration::from_secs(10))
            .expect("localhost resolves");
        assert!(addrs
            .iter()
            .all(|a| a.port() == 6379 && a.ip().is_loopback()));
    }

    static SLOW_LOOKUPS: AtomicUsize = AtomicUsize::new(0);

    fn slow_lookup(_: &str, port: u16) -> Answer {
        SLOW_LOOKUPS.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
        Ok(vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)])
    }

    #[test]
    fn a_slow_lookup_times_out_within_the_limit_and_the_next_connect_waits_for_it_again() {
        let resolver = Resolver {
            lookup: slow_lookup,
            ..Resolver::new("slow.example", 7000)
        };
        let start = Instant::now();
        assert_eq!(
            resolver.resolve(Duration::from_millis(20)),
            Err(Failure::TimedOut)
        );
        assert!(
            start.elapsed() < Duration::from_millis(250),
            "resolve waited {:?} for a lookup that takes 300 ms, past its 20 ms limit",
            start.elapsed()
        );
        let addrs = resolver
            .resolve(Duration::from_secs(10))
            .expect("the lookup started by the first call answers");
        assert_eq!(addrs[0].port(), 7000);
        assert_eq!(
            SLOW_LOOKUPS.load(Ordering::SeqCst),
            1,
            "the second call waited for the running lookup instead of starting one"
        );
    }

    fn failing_lookup(_: &str, _: u16) -> Answer {
        Err(io::Error::other("no such host"))
    }

    fn empty_lookup(_: &str, _: u16) -> Answer {
        Ok(Vec::new())
    }

    #[test]
    fn a_failed_or_empty_lookup_is_a_connect_error_naming_the_host() {
        for lookup in [failing_lookup as Lookup, empty_lookup] {
            let resolver = Resolver {
                lookup,
                ..Resolver::new("nowhere.example", 1)
            };
            let err = resolver.resolve(Duration::from_secs(1)).unwrap_err();
            let Failure::Error(NodeError::Connect(message)) = err else {
                panic!("expected a connect error, got {err:?}");
            };
            assert!(message.contains("nowhere.example"), "{message}");
        }
    }
}
