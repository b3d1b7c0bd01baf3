//! A node's connection, split in two: one thread may write while another
//! is blocked reading.
//!
//! TCP and Unix sockets are our own, cloned into a writing and a reading
//! half. The `redis` crate parses replies, but for the commonest ones. A TLS
//! connection cannot be split, as the `redis` crate owns it. Its one half
//! does both: its reader writes what was queued once its read returns.
//!
//! Every read syscall waits at most the time left. A reply in pieces is
//! read piece by piece against the same deadline. So no server can hold a
//! read past it by trickling bytes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use crate::error::{Failure, NodeError};

// Syscall counters for the benchmark: how many writes and reads the
// crate's sockets made. Relaxed: a count, not a sync.
static WRITES: AtomicU64 = AtomicU64::new(0);
static READS: AtomicU64 = AtomicU64::new(0);

/// How many socket syscalls the crate has made so far, in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounts {
    /// `write` calls on the nodes' sockets (TLS connections not counted).
    pub writes: u64,
    /// `read` calls on the nodes' sockets (TLS connections not counted).
    pub reads: u64,
}

/// The counts so far; subtract two readings for a stretch of work.
pub fn io_counts() -> IoCounts {
    IoCounts {
        writes: WRITES.load(Ordering::Relaxed),
        reads: READS.load(Ordering::Relaxed),
    }
}

/// How far past the deadline a socket timeout may reach, and so a read or
/// write. Within it, a timeout already set is kept: one `setsockopt` saved
/// per read.
const TIMEOUT_SLACK: Duration = Duration::from_micros(500);

/// Runs `$body` with `$s` bound to `$stream`'s socket, of either kind.
macro_rules! on_socket {
    ($stream:expr, $s:ident => $body:expr) => {
        match $stream {
            Stream::Tcp($s) => $body,
            #[cfg(unix)]
            Stream::Unix($s) => $body,
        }
    };
}

/// A socket of ours.
pub(crate) enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `addr` within `limit`, with Nagle's algorithm off.
    pub(crate) fn tcp(addr: &SocketAddr, limit: Duration) -> Result<Stream, Failure> {
        let stream = TcpStream::connect_timeout(addr, limit).map_err(connect_failure)?;
        stream.set_nodelay(true).map_err(connect_failure)?;
        Ok(Stream::Tcp(stream))
    }

    #[cfg(unix)]
    pub(crate) fn unix(path: &std::path::Path) -> Result<Stream, Failure> {
        UnixStream::connect(path)
            .map(Stream::Unix)
            .map_err(connect_failure)
    }

    /// The two halves: a writer and a reader over the same socket.
    pub(crate) fn split(self) -> Result<(Writer, Option<Reader>), Failure> {
        let other = match &self {
            Stream::Tcp(s) => s.try_clone().map(Stream::Tcp),
            #[cfg(unix)]
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
        }
        .map_err(connect_failure)?;
        Ok((
            Writer::Stream(self, None),
            Some(Reader {
                stream: other,
                timeout: None,
                buf: vec![0; READ_SIZE],
                start: 0,
                end: 0,
                parser: redis::Parser::new(),
                parsing: 0,
            }),
        ))
    }

    /// Ends the connection for both halves: a read blocked on it returns.
    fn shutdown(&self) {
        let _ = on_socket!(self, s => s.shutdown(Shutdown::Both));
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        WRITES.fetch_add(1, Ordering::Relaxed);
        on_socket!(self, s => s.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The writing half of a connection; for TLS, the whole, which reads too.
pub(crate) enum Writer {
    /// A socket of ours, and the write timeout set on it.
    Stream(Stream, Option<Duration>),
    /// A connection the `redis` crate owns (TLS), and its read and write
    /// timeouts.
    Unsplit(redis::Connection, [Option<Duration>; 2]),
}

impl Writer {
    /// Writes `bytes`, giving up at `deadline`.
    ///
    /// A write of a few commands blocks only if the server stopped reading
    /// and its buffer filled. So past the deadline a write still goes out, with the smallest
    /// timeout. Another node's slow connect must not fail this healthy one.
    pub(crate) fn send(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), Failure> {
        let left = left_or_least(deadline);
        match self {
            Writer::Stream(stream, timeout) => {
                let set = |t| on_socket!(&*stream, s => s.set_write_timeout(Some(t)));
                refresh(timeout, left, set).map_err(failure)?;
                // (write_all retries a write a signal interrupted.)
                stream.write_all(bytes).map_err(failure)
            }
            Writer::Unsplit(inner, [_, timeout]) => {
                let set = |t| inner.set_write_timeout(Some(t));
                refresh(timeout, left, set).map_err(failure)?;
                inner.send_packed_command(bytes).map_err(failure)
            }
        }
    }

    /// Reads one reply through an unsplit connection (TLS), giving up at
    /// `deadline`. A split writer cannot read.
    pub(crate) fn recv(&mut self, deadline: Instant) -> Result<Value, Failure> {
        match self {
            Writer::Unsplit(inner, [timeout, _]) => {
                let set = |t| inner.set_read_timeout(Some(t));
                refresh(timeout, left_or_least(deadline), set).map_err(failure)?;
                inner.recv_response().map_err(failure)
            }
            Writer::Stream(..) => Err(io_failure("a split connection reads through its reader")),
        }
    }

    /// Ends the connection, so that a thread blocked reading it returns.
    pub(crate) fn shutdown(&self) {
        if let Writer::Stream(stream, _) = self {
            stream.shutdown();
        }
    }
}

/// The reading half of a split connection: replies come in order.
pub(crate) struct Reader {
    stream: Stream,
    timeout: Option<Duration>,
    /// Bytes read and not yet parsed: `buf[start..end]`. Zeroed once, not per
    /// read. A larger reply goes to the parser in pieces.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Kept, with its buffer: a parser per reply allocates several KiB.
    parser: redis::Parser,
    /// How much of the reply under way the parser took in.
    parsing: usize,
}

impl Reader {
    /// Ends the connection, so that a thread blocked writing it returns.
    pub(crate) fn shutdown(&self) {
        self.stream.shutdown();
    }

    /// Reads one reply, giving up at `deadline`.
    ///
    /// Past the deadline a read still collects a reply already here, with
    /// the smallest timeout.
    pub(crate) fn recv(&mut self, deadline: Instant) -> Result<Value, Failure> {
        self.recv_until(deadline, deadline)
            .and_then(|reply| reply.ok_or(Failure::TimedOut))
    }

    /// Like [`recv`](Self::recv), but returns `None` at `pause` with no
    /// whole reply yet. The connection stays up, and a partial reply is
    /// kept for the next read.
    pub(crate) fn recv_until(
        &mut self,
        deadline: Instant,
        pause: Instant,
    ) -> Result<Option<Value>, Failure> {
        let paused = |now: Instant| now >= pause && now < deadline;
        let mut read = false;
        loop {
            if let Some(reply) = self.recv_buffered() {
                return reply.map(Some);
            }
            let now = Instant::now();
            if read && paused(now) {
                return Ok(None);
            }
            // Each piece waits only for the time left: trickling cannot hold
            // the read past the deadline.
            if read && now >= deadline {
                return Err(Failure::TimedOut);
            }
            // The parser took every byte: refill the buffer afresh.
            (self.start, self.end) = (0, 0);
            let left = left_or_least(pause.min(deadline));
            let stream = &self.stream;
            let set = |t| on_socket!(stream, s => s.set_read_timeout(Some(t)));
            refresh(&mut self.timeout, left, set).map_err(failure)?;
            READS.fetch_add(1, Ordering::Relaxed);
            match on_socket!(&mut self.stream, s => s.read(&mut self.buf[self.end..])) {
                Ok(0) => return Err(io_failure("the server closed the connection")),
                Ok(n) => self.end += n,
                // A signal: with a socket timeout set, the OS does not restart the read by itself.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let failure = failure(e);
                    if failure == Failure::TimedOut && paused(Instant::now()) {
                        return Ok(None);
                    }
                    return Err(failure);
                }
            }
            read = true;
        }
    }

    /// The next reply if already here whole, without a syscall. One read
    /// often brings several threads' replies.
    pub(crate) fn recv_buffered(&mut self) -> Option<Result<Value, Failure>> {
        let here = &self.buf[self.start..self.end];
        let common = [4, 5]
            .into_iter()
            .find_map(|n| Some((common_reply(here.get(..n)?)?, n)));
        Some(match common {
            _ if here.is_empty() => return None,
            Some((value, n)) if self.parsing == 0 => {
                self.start += n;
                Ok(value)
            }
            _ => {
                let mut lines = Lines { here, taken: 0 };
                let parsed = self.parser.parse_value(&mut lines);
                (self.start, self.parsing) = (self.start + lines.taken, self.parsing + lines.taken);
                match parsed {
                    Err(_) if self.parsing > MAX_REPLY => Err(Failure::Error(NodeError::Io(
                        format!("a reply longer than {MAX_REPLY} bytes"),
                    ))),
                    // Not whole yet: the parser keeps what it took in.
                    Err(e) if e.is_timeout() => return None,
                    parsed => {
                        self.parsing = 0;
                        parsed.map_err(failure)
                    }
                }
            }
        })
    }
}

/// The reader's bytes, handed to its parser a line at a time. Every reply
/// ends with `\n`, so the parser never takes more than its reply. The rest
/// stays in the reader's buffer.
struct Lines<'a> {
    here: &'a [u8],
    taken: usize,
}

impl Read for Lines<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let rest = &self.here[self.taken..];
        if rest.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let line = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        let n = line.min(out.len());
        out[..n].copy_from_slice(&rest[..n]);
        self.taken += n;
        Ok(n)
    }
}

/// How much one read takes in at most: the read buffer's size.
const READ_SIZE: usize = 4096;

/// The replies nearly every round gets, parsed without the `redis` crate's
/// costly general parser. That is `OK` and nil for `SET ... NX`, 0 and 1
/// for the scripts. The values are the ones that parser gives. Each is a
/// whole reply, also as the first bytes of several.
fn common_reply(frame: &[u8]) -> Option<Value> {
    match frame {
        b"+OK\r\n" => Some(Value::Okay),
        b"$-1\r\n" => Some(Value::Nil),
        b":0\r\n" => Some(Value::Int(0)),
        b":1\r\n" => Some(Value::Int(1)),
        _ => None,
    }
}

/// The largest reply we read: our largest is `INFO server`, a few KiB.
const MAX_REPLY: usize = 16 << 20;

/// The time left until `deadline`, or past it the smallest timeout. A
/// socket timeout of zero would mean none.
fn left_or_least(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_micros(1))
}

/// Sets the socket timeout (with `set`; `timeout` is the one set) to wait
/// about `left`. The one set will do if it is not short of `left`, and not
/// longer by more than [`TIMEOUT_SLACK`]. Falling short would time out a
/// healthy node early. A new one reaches half the slack past `left`. So
/// the next rounds keep it while their time left differs by less.
fn refresh<E>(
    timeout: &mut Option<Duration>,
    left: Duration,
    set: impl FnOnce(Duration) -> Result<(), E>,
) -> Result<(), E> {
    if timeout.is_none_or(|t| t < left || t > left + TIMEOUT_SLACK) {
        let t = left + TIMEOUT_SLACK / 2;
        set(t)?;
        *timeout = Some(t);
    }
    Ok(())
}

/// What a failed read or write means for the round: a timeout, or an error.
pub(crate) fn failure(e: impl Into<redis::RedisError>) -> Failure {
    failure_as(e.into(), NodeError::Io)
}

/// Like [`failure`], for a connect.
pub(crate) fn connect_failure(e: impl Into<redis::RedisError>) -> Failure {
    failure_as(e.into(), NodeError::Connect)
}

/// A failure of the connection that is no I/O error, in words.
pub(crate) fn io_failure(what: &str) -> Failure {
    Failure::Error(NodeError::Io(what.to_string()))
}

fn failure_as(e: redis::RedisError, error: fn(String) -> NodeError) -> Failure {
    match e.is_timeout() {
        true => Failure::TimedOut,
        false => Failure::Error(error(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader over one end of a socket pair, and the other end.
    #[cfg(unix)]
    fn pair() -> (Reader, UnixStream) {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        let (_, reader) = Stream::Unix(ours).split().expect("split");
        (reader.expect("a reading half"), theirs)
    }

    #[cfg(unix)]
    #[test]
    fn replies_are_read_whole_in_order_and_bad_ones_fail_the_connection() {
        let deadline = || Instant::now() + Duration::from_secs(5);
        let (mut reader, mut server) = pair();
        server
            .write_all(b"+OK\r\n:12\r\n$3\r\na\nb\r\n*2\r\n:1\r\n$-1\r\n:1\r\n-ERR no\r\n")
            .unwrap();
        assert_eq!(reader.recv(deadline()), Ok(Value::Okay));
        assert_eq!(reader.recv(deadline()), Ok(Value::Int(12)));
        let bulk = Value::BulkString(b"a\nb".to_vec());
        assert_eq!(reader.recv(deadline()), Ok(bulk));
        let array = Value::Array(vec![Value::Int(1), Value::Nil]);
        assert_eq!(reader.recv(deadline()), Ok(array));
        assert_eq!(reader.recv(deadline()), Ok(Value::Int(1)));
        assert!(matches!(reader.recv(deadline()), Ok(Value::ServerError(_))));
        for bad in [&b"?\r\n"[..], b"$x\r\n", &b"*1\r\n".repeat(200)] {
            let (mut reader, mut server) = pair();
            server.write_all(bad).unwrap();
            assert!(
                matches!(reader.recv(deadline()), Err(Failure::Error(_))),
                "{:?} fails (nesting is bounded, not a stack overflow)",
                &bad[..4]
            );
        }
    }

    #[test]
    fn the_common_replies_parse_as_the_redis_parser_parses_them() {
        for frame in [&b"+OK\r\n"[..], b"$-1\r\n", b":0\r\n", b":1\r\n"] {
            let general = redis::Parser::new().parse_value(frame).expect("a reply");
            assert_eq!(common_reply(frame), Some(general), "{frame:?}");
        }
        for frame in [
            &b"+PONG\r\n"[..],
            b"+OKAY\r\n",
            b":2\r\n",
            b":10\r\n",
            b":01\r\n",
            b"$-10\r\n",
            b"$0\r\n\r\n",
            b"-ERR x\r\n",
        ] {
            assert_eq!(common_reply(frame), None, "{frame:?} goes to the parser");
        }
    }

    /// Replies larger than the read buffer, and many replies in one read,
    /// come back whole and in order: the buffer grows, and what is left
    /// of one read moves to the front for the next.
    #[test]
    fn replies_larger_than_one_read_and_many_in_one_read_come_whole_and_in_order() {
        use redlock_sync_testing::Cluster;

        let cluster = Cluster::start(1).expect("a redis-server node");
        let port = cluster.node(0).port().expect("a TCP node");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("an address");
        let stream = Stream::tcp(&addr, Duration::from_secs(5)).expect("connected");
        let (mut writer, reader) = stream.split().expect("split");
        let mut reader = reader.expect("a reading half");
        let deadline = Instant::now() + Duration::from_secs(30);
        let big = "x".repeat(5 * READ_SIZE + 7);
        let mut out = Vec::new();
        crate::store::script::pack(&mut out, &[b"SET", b"big", big.as_bytes()]);
        for _ in 0..3 {
            crate::store::script::pack(&mut out, &[b"GET", b"big"]);
            for i in 0..200 {
                crate::store::script::pack(&mut out, &[b"ECHO", i.to_string().as_bytes()]);
            }
        }
        writer.send(&out, deadline).expect("sent");
        assert_eq!(reader.recv(deadline), Ok(Value::Okay));
        for _ in 0..3 {
            let value = Value::BulkString(big.clone().into_bytes());
            assert_eq!(reader.recv(deadline), Ok(value), "the large reply, whole");
            for i in 0..200 {
                let value = Value::BulkString(i.to_string().into_bytes());
                assert_eq!(reader.recv(deadline), Ok(value), "reply {i}, in order");
            }
        }
    }

    /// A read that pauses before a reply is whole returns nothing and
    /// keeps the connection: what came of the reply so far is kept, and
    /// the next read returns it whole (a thread whose own command waits
    /// pauses its read of other threads' replies, then writes it).
    #[test]
    fn a_paused_read_keeps_what_came_of_a_reply_for_the_next_read() {
        use redlock_sync_testing::{Cluster, Fault, Proxy};

        let cluster = Cluster::start(1).expect("a redis-server node");
        let port = cluster.node(0).port().expect("a TCP node");
        let proxy = Proxy::start(&format!("127.0.0.1:{port}")).expect("a proxy");
        let addr: SocketAddr = proxy
            .url()
            .trim_start_matches("redis://")
            .parse()
            .expect("the proxy's address");
        let stream = Stream::tcp(&addr, Duration::from_secs(5)).expect("connected");
        let (mut writer, reader) = stream.split().expect("split");
        let mut reader = reader.expect("a reading half");
        let deadline = Instant::now() + Duration::from_secs(30);
        // One byte every 20 ms: `+PONG\r\n` takes 140 ms to come whole.
        proxy.set_fault(Fault::TrickleReplies(Duration::from_millis(20)));
        writer.send(b"PING\r\n", deadline).expect("sent");
        let pause = Instant::now() + Duration::from_millis(50);
        let paused = reader.recv_until(deadline, pause).expect("no failure");
        assert_eq!(paused, None, "no whole reply by the pause");
        assert!(Instant::now() >= pause, "returned at the pause, not before");
        assert!(reader.parsing > 0, "part of the reply came");
        let reply = reader.recv(deadline).expect("the rest of the reply");
        assert_eq!(reply, Value::SimpleString("PONG".to_string()));
    }

    #[cfg(unix)]
    #[test]
    fn replies_split_over_reads_are_never_taken_for_common_ones_nor_lost_at_a_deadline() {
        let soon = || Instant::now() + Duration::from_millis(50);
        let bytes = b"*3\r\n:1\r\n$-1\r\n+OK\r\n:1\r\n$5\r\n:1\r\n\n\r\n:0\r\n";
        // One byte at a time, with a pause after each: whole replies, in order.
        let (mut reader, mut server) = pair();
        let mut got = Vec::new();
        for b in bytes {
            server.write_all(&[*b]).unwrap();
            match reader.recv_until(Instant::now() + Duration::from_secs(5), Instant::now()) {
                Ok(Some(v)) => got.push(v),
                Ok(None) => {}
                Err(e) => panic!("{e:?}"),
            }
            while let Some(v) = reader.recv_buffered() {
                got.push(v.unwrap());
            }
        }
        assert_eq!(
            got,
            vec![
                Value::Array(vec![Value::Int(1), Value::Nil, Value::Okay]),
                Value::Int(1),
                Value::BulkString(b":1\r\n\n".to_vec()),
                Value::Int(0),
            ]
        );
        // A deadline passing mid-reply: the rest is still read whole later.
        let (mut reader, mut server) = pair();
        server.write_all(b"*2\r\n:1").unwrap();
        assert_eq!(reader.recv(soon()), Err(Failure::TimedOut));
        server.write_all(b"\r\n:1\r\n:0\r\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            reader.recv(deadline),
            Ok(Value::Array(vec![Value::Int(1), Value::Int(1)]))
        );
        assert_eq!(reader.recv(deadline), Ok(Value::Int(0)));
    }

    #[cfg(unix)]
    #[test]
    fn hostile_replies_fail_or_time_out_in_time_without_a_panic() {
        let bad: Vec<Vec<u8>> = vec![
            b"%-1\r\n".to_vec(),
            b"%-2\r\n".to_vec(),
            b"|-1\r\n".to_vec(),
            b"|9223372036854775807\r\n".to_vec(),
            b"*-2\r\n".to_vec(),
            b"~-3\r\n".to_vec(),
            b">-3\r\n".to_vec(),
            b"=-3\r\n".to_vec(),
            b"!-3\r\n".to_vec(),
            b"$-3\r\n".to_vec(),
            b"*9223372036854775807\r\n".to_vec(),
            b"$9223372036854775807\r\n".to_vec(),
            b"$18446744073709551615\r\n".to_vec(),
            b":99999999999999999999999\r\n".to_vec(),
            b",nan\r\n".to_vec(),
            b"(abc\r\n".to_vec(),
            b"#x\r\n".to_vec(),
            b"+\xff\xfe\r\n".to_vec(),
            b"*1\r\n".repeat(100_000),
            b"\r\n".to_vec(),
            b"\n".to_vec(),
        ];
        for bytes in bad {
            let (mut reader, server) = pair();
            let head = String::from_utf8_lossy(&bytes[..bytes.len().min(24)]).to_string();
            let writer = std::thread::spawn(move || {
                let mut server = server;
                let _ = server.write_all(&bytes);
                server
            });
            let start = Instant::now();
            let r = reader.recv(Instant::now() + Duration::from_millis(200));
            assert!(
                !matches!(r, Ok(Value::Okay | Value::Int(_))),
                "{head:?}: {r:?}"
            );
            assert!(start.elapsed() < Duration::from_secs(2), "{head:?}: {r:?}");
            drop(reader);
            drop(writer.join().unwrap());
        }
        // A huge bulk declared and sent: refused past MAX_REPLY, in time.
        let (mut reader, server) = pair();
        let writer = std::thread::spawn(move || {
            let mut server = server;
            let _ = server.write_all(b"$999999999\r\n");
            let chunk = vec![b'x'; 1 << 16];
            for _ in 0..400 {
                if server.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        // (Refused, not timed out: the reply is never whole.)
        let r = reader.recv(Instant::now() + Duration::from_secs(20));
        assert!(matches!(r, Err(Failure::Error(_))), "{r:?}");
        drop(reader);
        writer.join().unwrap();
    }

    #[test]
    fn timeouts_are_reset_only_when_they_no_longer_fit() {
        let left = Duration::from_millis(10);
        let reset = |mut timeout: Option<Duration>| {
            let mut reset = false;
            refresh::<()>(&mut timeout, left, |_| {
                reset = true;
                Ok(())
            })
            .unwrap();
            reset
        };
        assert!(reset(None));
        assert!(!reset(Some(left + TIMEOUT_SLACK / 2)));
        assert!(reset(Some(left - Duration::from_micros(1))));
        assert!(reset(Some(left + 2 * TIMEOUT_SLACK)));
    }
}
