//! The fault proxy: a TCP relay in front of one address whose [`Fault`]
//! (delay, partition, reset, trickled replies) can be switched while
//! connections are open. It knows nothing of Redis: it moves bytes.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::{io_error, lock, HarnessError, CONNECT_TIMEOUT};

/// Poll interval of the proxy's accept loop and pipe threads.
const PROXY_POLL: Duration = Duration::from_millis(5);

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
/// use redlock_sync_testing::{Cluster, Fault, Proxy};
///
/// # fn main() -> Result<(), redlock_sync_testing::HarnessError> {
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
    /// Bytes of replies written to clients.
    replied: AtomicU64,
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
            replied: AtomicU64::new(0),
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

    /// How many bytes of replies the proxy has written to its clients so
    /// far: a test waits for it to grow to know that a reply reached the
    /// client's socket.
    pub fn replied_bytes(&self) -> u64 {
        self.shared.replied.load(Ordering::SeqCst)
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
                if direction == Direction::Replies {
                    let n = chunk.len() as u64;
                    shared.replied.fetch_add(n, Ordering::SeqCst);
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
    use super::super::test_support::*;
    use super::super::Cluster;
    use super::*;

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
        assert_times_out(ping_over(&mut open));
        // Still open: another wait times out again instead of seeing EOF.
        assert_times_out(read_line(&mut open));
        // New connections are accepted and held, silently.
        let mut held = tcp(proxy.addr(), SHORT).unwrap();
        assert_times_out(ping_over(&mut held));

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
        assert_times_out(ping_over(&mut held));
        proxy.set_fault(Fault::None);
        // The target is down: now the connection gets closed.
        assert_closed_by_peer(&mut held);
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
        assert_closed_by_peer(&mut held);
    }
}
