//! Raw socket helpers the harness's unit tests share: they talk RESP by hand
//! so that a test sees exactly what a node or the proxy sends, timeouts and
//! resets included, with no client library in between.

use std::fmt::Debug;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use super::Node;

pub(super) const SHORT: Duration = Duration::from_millis(300);

/// Sends a raw `PING` and reads the reply line.
pub(super) fn ping_over<S: Read + Write>(stream: &mut S) -> io::Result<String> {
    stream.write_all(b"PING\r\n")?;
    read_line(stream)
}

pub(super) fn read_line<S: Read>(stream: &mut S) -> io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        // A read with a timeout can end early with EINTR after the process
        // was stopped and continued (no handler needed on Linux): read on.
        let read = match stream.read(&mut byte) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            read => read?,
        };
        match read {
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

pub(super) fn tcp(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

pub(super) fn node_addr(node: &Node) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], node.port().expect("a TCP node")))
}

pub(super) fn ping_tcp(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    ping_over(&mut tcp(addr, timeout)?)
}

pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

pub(super) fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Asserts that `result` failed by timing out (the peer stayed silent).
#[track_caller]
pub(super) fn assert_times_out<T: Debug>(result: io::Result<T>) {
    match result {
        Ok(value) => panic!("expected a timeout, got {value:?}"),
        Err(e) => assert!(is_timeout(&e), "expected a timeout, got {e:?}"),
    }
}

/// Asserts that the peer closes `stream` (EOF or reset) within two seconds,
/// sending nothing first.
#[track_caller]
pub(super) fn assert_closed_by_peer(stream: &mut TcpStream) {
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("setting a read timeout");
    let mut buf = [0u8; 16];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("unexpected bytes {:?}", &buf[..n]),
        Err(e) => assert!(!is_timeout(&e), "expected EOF or reset, got {e:?}"),
    }
}
