//! One node: its address, and one connection that every thread shares.
//!
//! Threads batch their commands on the shared connection. A thread that finds
//! another writing leaves its packed command in the node's outbox; the writer
//! writes the whole outbox, in one write, before it lets go. Writing and
//! reading are separate roles: a command never waits for a read to return
//! (except over TLS, whose connection cannot be split: there its reader
//! writes what was queued once its read returns). Replies come back in
//! order: each is matched to its request by sequence number and handed to
//! the thread that asked (or discarded, if that thread stopped waiting). No
//! async runtime, no background thread: the threads that want answers do
//! the I/O.
//!
//! Any error or timeout on the connection ends its *epoch*: the connection is
//! dropped for every thread that shared it, and every request still on it
//! fails. A reply is never matched across epochs, so a late reply can never
//! be taken for the answer to another command.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value};

use crate::error::{ConfigError, NodeError};
use crate::resolve::{Resolver, Unresolved};
use crate::restart_guard;
use crate::script::{self, pack, Command};
use crate::servers::Servers;
use crate::transport::{redis_connect_failure, Reader, Stream, Whole, Writer};

/// Past this many unread replies on a connection, a round waits for its
/// reply even after the outcome is decided, draining the backlog (or, on a
/// hung node, ending the connection). A reply is a few bytes, so this costs
/// little memory, and a node that is merely slow seldom holds up a round.
const MAX_BACKLOG: u64 = 1024;

/// Why one exchange with a node did not produce a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The round's deadline passed first.
    TimedOut,
    /// The round was decided without this node's reply (or it was not asked).
    NotAwaited,
    /// A connect (or its handshake) timed out: as `TimedOut`, and the node
    /// backs off reconnecting. Never leaves this module.
    ConnectTimedOut,
    /// Anything else.
    Error(NodeError),
}

/// A request on a node's connection: which epoch, and its place in line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    epoch: u64,
    seq: u64,
}

/// One Redis master.
pub(crate) struct Node {
    /// `host:port`, `tls host:port`, or the socket path; never the
    /// password.
    name: Arc<str>,
    /// What makes two nodes the same server: the address without the db.
    identity: String,
    /// Address only: no password, no db, no `CLIENT SETINFO`; we do the
    /// handshake ourselves, against the round's deadline.
    client: redis::Client,
    /// How the node is reached.
    route: Route,
    /// What a new connection sends first, packed: `AUTH` and `SELECT` if
    /// the URL asks for them, then `SCRIPT LOAD` for our scripts.
    handshake: Vec<u8>,
    /// How many replies the `AUTH` and `SELECT` give (an error there fails
    /// the connection).
    checked_replies: usize,
    /// How many `SCRIPT LOAD` replies follow (an error there only means the
    /// scripts go as `EVAL`).
    script_replies: usize,
    /// The restarted-node guard: with a grace period, a node up for less
    /// does not vote (its uptime comes with the handshake's `INFO server`).
    restart_grace: Option<Duration>,
    /// This node's place among its client's nodes, and the servers they
    /// reached (by `run_id`): a node that reaches a server another node
    /// reached first does not vote.
    index: usize,
    servers: Arc<Servers>,
    /// How long to wait before connecting again after a connect (or its
    /// handshake) timed out: a node that accepts connections but never
    /// answers (a stopped process) would otherwise cost every round its
    /// whole deadline.
    reconnect_backoff: Duration,
    state: Mutex<State>,
    /// Signalled when a reply a sleeper waits for is stored, when the
    /// reading role is let go with replies due, when a write lands while
    /// nobody reads, or when the epoch ends.
    changed: Condvar,
}

/// The shared connection and everything queued on it.
struct State {
    /// A connection is open in this epoch (or being opened).
    open: bool,
    /// The connection cannot be split (TLS): its writer also reads, so the
    /// reading role takes the writing role too.
    whole: bool,
    /// The connection's writing half, unless the writing thread holds it.
    writer: Option<Writer>,
    /// The reading half, unless the reading thread holds it (none for a
    /// whole connection).
    reader: Option<Reader>,
    /// A thread is writing (it has taken `writer`).
    writing: bool,
    /// A thread is reading (it has taken `reader`, or for a whole
    /// connection `writer`).
    reading: bool,
    /// Bumped whenever the connection is dropped.
    epoch: u64,
    /// Why the last epoch ended.
    ended: Option<(u64, Failure)>,
    /// Bits of the scripts known to be cached on this connection's server.
    scripts: u8,
    /// Packed commands not written yet, in sequence order.
    outbox: Vec<u8>,
    /// Sequence number of the next request, in this epoch.
    next_seq: u64,
    /// Requests below this sequence number are on the wire.
    written: u64,
    /// Sequence number of the next reply to read.
    next_read: u64,
    /// Replies read and not yet taken by their threads.
    replies: Vec<(u64, Value)>,
    /// One flag per request not read yet, from `next_read` on: whether its
    /// thread stopped waiting, so that its reply is discarded. (Never
    /// replayed: a command sent again later could land behind a later
    /// command of ours and undo it.)
    abandoned: VecDeque<bool>,
    /// The requests whose threads are blocked waiting for their replies
    /// (or for the reading role): a thread that stores one of these
    /// replies, or lets the reading role go while replies are due, wakes
    /// them. Nobody else is woken: a notify is a syscall, and every thread
    /// woken for nothing costs two more.
    sleepers: Vec<u64>,
    /// The last connection ended in a timeout, and no reply came since.
    slow: bool,
    /// No connect before this, after one timed out.
    connect_after: Option<Instant>,
    /// A moving average of how long a read of this node blocked, in
    /// microseconds: rounds read the nodes that keep them waiting last.
    wait_us: u64,
    /// Requests whose threads still want the reply (not read, not
    /// abandoned).
    live: u64,
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
        let route;
        let (name, identity) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                route = match host.parse::<IpAddr>() {
                    Ok(ip) => Route::Ip(SocketAddr::new(ip, *port)),
                    Err(_) => Route::Name(Resolver::new(host, *port)),
                };
                let n = format!("{host}:{port}");
                (n.clone(), format!("tcp {}", n.to_ascii_lowercase()))
            }
            ConnectionAddr::TcpTls { host, port, .. } => {
                route = Route::Whole;
                let n = format!("{host}:{port}");
                (
                    format!("tls {n}"),
                    format!("tcp {}", n.to_ascii_lowercase()),
                )
            }
            ConnectionAddr::Unix(path) => {
                route = unix_route(path);
                let n = path.display().to_string();
                (n.clone(), format!("unix {n}"))
            }
            other => return Err(bad(format!("unsupported address {other:?}"))),
        };
        let mut handshake = Vec::new();
        let mut checked_replies = 0;
        if let Some(password) = redis.password() {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = redis.username() {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            pack(&mut handshake, &args);
            checked_replies += 1;
        }
        if redis.db() != 0 {
            pack(
                &mut handshake,
                &[b"SELECT", redis.db().to_string().as_bytes()],
            );
            checked_replies += 1;
        }
        let script_replies = script::load_all(&mut handshake);
        // Last: the server's run_id (and uptime, for the restart guard).
        handshake.extend_from_slice(&restart_guard::info_server());
        let bare = info
            .clone()
            .set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name())
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(bare).map_err(|e| bad(e.to_string()))?;
        Ok(Node {
            name: name.into(),
            identity,
            client,
            route,
            handshake,
            checked_replies,
            script_replies,
            restart_grace: None,
            index: 0,
            servers: Arc::default(),
            reconnect_backoff: Duration::ZERO,
            state: Mutex::new(State {
                open: false,
                whole: false,
                writer: None,
                reader: None,
                writing: false,
                reading: false,
                epoch: 0,
                ended: None,
                scripts: 0,
                outbox: Vec::new(),
                next_seq: 0,
                written: 0,
                next_read: 0,
                replies: Vec::new(),
                abandoned: VecDeque::new(),
                sleepers: Vec::new(),
                slow: false,
                connect_after: None,
                wait_us: 0,
                live: 0,
            }),
            changed: Condvar::new(),
        })
    }

    /// Turns the restarted-node guard on (a zero grace leaves it off): every
    /// new connection reads the server's uptime with `INFO server`,
    /// pipelined with the handshake, and fails with
    /// [`NodeError::Restarted`] while the uptime is below `grace`.
    pub(crate) fn guard_restarts(&mut self, grace: Duration) {
        self.restart_grace = Some(grace).filter(|g| !g.is_zero());
    }

    /// Makes this node the `index`th of a client whose nodes share
    /// `servers`.
    pub(crate) fn join(
        &mut self,
        index: usize,
        servers: &Arc<Servers>,
        reconnect_backoff: Duration,
    ) {
        self.index = index;
        self.servers = Arc::clone(servers);
        self.reconnect_backoff = reconnect_backoff;
    }

    /// The node's address for people: `host:port`, `tls host:port`, or the
    /// socket path.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Two nodes with the same identity are the same server.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `cmd` on the connection and gets it written: by this thread
    /// now, or, if another thread is writing, by that thread before it lets
    /// go. Connects first if there is no connection.
    pub(crate) fn submit(
        &self,
        cmd: &Command,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Ticket, Failure> {
        self.submit_as(cmd, deadline, connect_timeout, false)
    }

    /// Like [`submit`](Self::submit), but a script always goes as `EVAL`:
    /// for a request whose reply nobody will read, and for the retry after
    /// a `NOSCRIPT` (meanwhile another thread may have seen the script run
    /// and marked it cached again).
    pub(crate) fn submit_eval(
        &self,
        cmd: &Command,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Ticket, Failure> {
        self.submit_as(cmd, deadline, connect_timeout, true)
    }

    fn submit_as(
        &self,
        cmd: &Command,
        deadline: Instant,
        connect_timeout: Duration,
        eval: bool,
    ) -> Result<Ticket, Failure> {
        let mut st = self.lock();
        let bytes = cmd.bytes_for(if eval { 0 } else { st.scripts });
        st.outbox.extend_from_slice(bytes);
        let ticket = Ticket {
            epoch: st.epoch,
            seq: st.next_seq,
        };
        st.next_seq += 1;
        st.abandoned.push_back(false);
        st.live += 1;
        st = self.write_out(st, deadline, connect_timeout);
        check(&st, ticket)?;
        Ok(ticket)
    }

    /// Waits for the reply to `ticket`, reading it (and whatever comes
    /// before it) when no other thread is doing I/O.
    pub(crate) fn wait(
        &self,
        ticket: Ticket,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<Value, Failure> {
        self.take(ticket, deadline, connect_timeout, true)
            .unwrap_or(Err(Failure::TimedOut))
    }

    /// Like [`wait`](Self::wait), but returns `None` instead of sleeping
    /// when another thread is doing I/O on the connection.
    pub(crate) fn poll(
        &self,
        ticket: Ticket,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Option<Result<Value, Failure>> {
        self.take(ticket, deadline, connect_timeout, false)
    }

    fn take(
        &self,
        ticket: Ticket,
        deadline: Instant,
        connect_timeout: Duration,
        block: bool,
    ) -> Option<Result<Value, Failure>> {
        let mut st = self.lock();
        let taken = loop {
            if let Err(failure) = check(&st, ticket) {
                break Some(Err(failure));
            }
            if let Some(i) = st.replies.iter().position(|(seq, _)| *seq == ticket.seq) {
                break Some(Ok(st.replies.swap_remove(i).1));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if st.next_read < st.written && can_read(&st) {
                if left.is_zero() && st.live > 1 {
                    // Late, and other threads still want replies on this
                    // connection: a read that timed out now would drop it
                    // for them too. Leave the reading to them.
                    give_up(&mut st, ticket.seq);
                    break Some(Err(Failure::TimedOut));
                }
                st = self.read_one(st, deadline, connect_timeout);
                continue;
            }
            if ticket.seq >= st.written && !st.writing && !st.outbox.is_empty() {
                st = self.write_out(st, deadline, connect_timeout);
                continue;
            }
            if left.is_zero() {
                give_up(&mut st, ticket.seq);
                break Some(Err(Failure::TimedOut));
            }
            if !block {
                break None;
            }
            st.sleepers.push(ticket.seq);
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if let Some(i) = st.sleepers.iter().position(|&seq| seq == ticket.seq) {
                st.sleepers.swap_remove(i);
            }
        };
        // Leaving: if replies are due and nobody reads them, wake the
        // sleepers, one of which takes the reading role over.
        if !st.sleepers.is_empty() && st.next_read < st.written && can_read(&st) {
            self.changed.notify_all();
        }
        taken
    }

    /// Whether writing to the node now means connecting first (it has no
    /// connection, and is not backing off reconnecting): that may block up
    /// to the connect timeout.
    pub(crate) fn will_connect(&self) -> bool {
        let st = self.lock();
        !st.open && !st.writing && st.connect_after.is_none_or(|after| after <= Instant::now())
    }

    /// How late this node tends to answer, coarsely (a power-of-two bucket
    /// of the average time a read of it blocked; the largest value once its
    /// last connection timed out): rounds read the nodes in this order, so
    /// a round that a quorum decided need not wait for the slow ones.
    pub(crate) fn lateness(&self) -> u32 {
        let st = self.lock();
        if st.slow {
            u32::MAX
        } else {
            st.wait_us.max(1).ilog2()
        }
    }

    /// Whether the connection has so many unread replies that the next
    /// round should wait for its reply rather than leave it unread.
    pub(crate) fn backlogged(&self, ticket: Ticket) -> bool {
        let st = self.lock();
        st.epoch == ticket.epoch && ticket.seq >= st.next_read + MAX_BACKLOG
    }

    /// The reply to `ticket` is no longer wanted: discard it when it comes.
    pub(crate) fn abandon(&self, ticket: Ticket) {
        let mut st = self.lock();
        if st.epoch != ticket.epoch {
            return;
        }
        match st.replies.iter().position(|(seq, _)| *seq == ticket.seq) {
            Some(i) => {
                let (_, reply) = st.replies.swap_remove(i);
                forget_scripts_if_lost(&mut st, &reply);
            }
            None => give_up(&mut st, ticket.seq),
        }
    }

    /// Records whether the server of `ticket`'s connection has `script`.
    pub(crate) fn note_script(&self, ticket: Ticket, bit: u8, known: bool) {
        let mut st = self.lock();
        if st.epoch == ticket.epoch {
            if known {
                st.scripts |= bit;
            } else {
                st.scripts &= !bit;
            }
        }
    }

    /// The writing role: writes the outbox until it is empty (connecting
    /// first if there is no connection), then lets go. If another thread is
    /// writing, it writes the outbox before it lets go. The lock is not held
    /// during I/O.
    fn write_out<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> MutexGuard<'a, State> {
        if st.writing || st.outbox.is_empty() {
            return st;
        }
        let epoch = st.epoch;
        st.writing = true;
        // Nobody reads a connection before its handshake is over.
        let connecting = !st.open;
        if connecting {
            st.open = true;
            st.reading = true;
        }
        let mut writer = st.writer.take();
        let mut connecting = connecting;
        while !st.outbox.is_empty() {
            let out = std::mem::take(&mut st.outbox);
            let count = st.next_seq - st.written;
            let connect_after = st.connect_after;
            drop(st);
            let mut opened = None;
            let (mut w, sent) = match writer.take() {
                Some(w) => (Some(w), Ok(())),
                None => {
                    match self.connect_unless_backing_off(connect_after, deadline, connect_timeout)
                    {
                        Ok((w, reader, scripts)) => {
                            opened = Some((reader, scripts));
                            (Some(w), Ok(()))
                        }
                        Err(failure) => (None, Err(failure)),
                    }
                }
            };
            let sent = sent.and_then(|()| match &mut w {
                Some(w) => w.send(&out, deadline),
                None => Ok(()),
            });
            st = self.lock();
            if st.epoch != epoch {
                // The reader ended the connection meanwhile: what was just
                // written failed with it.
                break;
            }
            if opened.is_some() {
                st.connect_after = None;
            }
            match (sent, w) {
                (Ok(()), Some(w)) => {
                    if let Some((reader, scripts)) = opened {
                        st.whole = w.is_whole();
                        st.reader = reader;
                        st.scripts = scripts;
                    }
                    if connecting {
                        // The handshake is over: replies may be read now,
                        // while more is written.
                        connecting = false;
                        st.reading = false;
                        if !st.sleepers.is_empty() {
                            self.changed.notify_all();
                        }
                    }
                    writer = Some(w);
                    st.written += count;
                    if st.outbox.is_empty() {
                        // Keep the buffer's capacity for the next batch.
                        st.outbox = out;
                        st.outbox.clear();
                    }
                }
                (Err(Failure::ConnectTimedOut), _) => {
                    st.connect_after = Instant::now().checked_add(self.reconnect_backoff);
                    end_epoch(&mut st, Failure::TimedOut);
                    break;
                }
                (Err(failure), w) => {
                    // The cause is recorded first: ending the socket makes the
                    // reader fail too, for no reason of its own.
                    end_epoch(&mut st, failure);
                    if let Some(w) = w {
                        w.shutdown();
                    }
                    break;
                }
                (Ok(()), None) => break,
            }
        }
        if st.epoch == epoch {
            st.writer = writer;
            st.writing = false;
            if connecting {
                st.reading = false;
            }
        }
        // Sleepers want replies: a thread that is reading wakes them when it
        // lets go. Otherwise what was written may be theirs to read now.
        if !st.sleepers.is_empty() && (!st.reading || st.epoch != epoch) {
            self.changed.notify_all();
        }
        st
    }

    /// The reading role: reads one reply and hands it to its thread (or
    /// discards it), then lets go; over a whole connection, then writes
    /// what was queued meanwhile. The lock is not held during I/O.
    fn read_one<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> MutexGuard<'a, State> {
        let epoch = st.epoch;
        let whole = st.whole;
        st.reading = true;
        if whole {
            st.writing = true;
        }
        let mut reader = st.reader.take();
        let mut writer = if whole { st.writer.take() } else { None };
        drop(st);
        let began = Instant::now();
        let received = match (&mut reader, &mut writer) {
            (Some(r), _) => r.recv(deadline),
            (None, Some(w)) => w.recv(deadline),
            (None, None) => Err(Failure::Error(NodeError::Io(
                "the connection has no reading half".to_string(),
            ))),
        };
        let waited = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
        st = self.lock();
        let mut wake = false;
        if st.epoch == epoch {
            match received {
                Ok(value) => {
                    st.slow = false;
                    st.wait_us = st.wait_us - st.wait_us / 8 + waited / 8;
                    let seq = st.next_read;
                    wake = st.sleepers.contains(&seq);
                    st.next_read += 1;
                    if st.abandoned.pop_front().unwrap_or(false) {
                        forget_scripts_if_lost(&mut st, &value);
                    } else {
                        st.live -= 1;
                        st.replies.push((seq, value));
                    }
                    st.reader = reader;
                    st.reading = false;
                    if whole {
                        st.writer = writer;
                        st.writing = false;
                    }
                }
                Err(failure) => {
                    // The cause is recorded first: ending the socket makes
                    // a writer fail too, for no reason of its own.
                    end_epoch(&mut st, failure);
                    if let Some(r) = &reader {
                        r.shutdown();
                    }
                    wake = true;
                }
            }
        }
        if wake && !st.sleepers.is_empty() {
            self.changed.notify_all();
        }
        if whole {
            st = self.write_out(st, deadline, connect_timeout);
        }
        st
    }

    /// [`connect`](Self::connect), unless a connect timed out less than the
    /// reconnect backoff ago: then fail at once. A timeout starts the
    /// backoff (the caller records it through the failure).
    fn connect_unless_backing_off(
        &self,
        connect_after: Option<Instant>,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<(Writer, Option<Reader>, u8), Failure> {
        if let Some(after) = connect_after {
            let wait = after.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                return Err(Failure::Error(NodeError::Connect(format!(
                    "a connect timed out; not trying again for {wait:?}"
                ))));
            }
        }
        // No time left to try: a timeout of the round, not of this node.
        time_left(deadline)?;
        self.connect(deadline, connect_timeout).map_err(|failure| {
            if failure == Failure::TimedOut {
                Failure::ConnectTimedOut
            } else {
                failure
            }
        })
    }

    /// Opens a new connection, authenticates, selects the db and loads our
    /// scripts, all within `connect_timeout` and never past `deadline`.
    /// Returns the connection's halves (one, for TLS) and the bits of the
    /// scripts its server has.
    pub(crate) fn connect(
        &self,
        deadline: Instant,
        connect_timeout: Duration,
    ) -> Result<(Writer, Option<Reader>, u8), Failure> {
        let limit = time_left(deadline)?.min(connect_timeout);
        // The handshake is part of the connect, within the same bound.
        let deadline = Instant::now() + limit;
        let (mut writer, mut reader) = match &self.route {
            Route::Ip(addr) => split(Stream::tcp(addr, limit)?)?,
            Route::Name(resolver) => split(self.connect_resolved(resolver, limit)?)?,
            #[cfg(unix)]
            Route::Unix(path) => split(Stream::unix(path)?)?,
            Route::Whole => (Writer::Whole(Whole::new(self.connect_whole(limit)?)), None),
        };
        let mut recv = |writer: &mut Writer| match &mut reader {
            Some(r) => r.recv(deadline),
            None => writer.recv(deadline),
        };
        writer.send(&self.handshake, deadline)?;
        let mut scripts = script::ALL_SCRIPTS;
        for i in 0..self.checked_replies + self.script_replies {
            if let Value::ServerError(e) = recv(&mut writer)? {
                if i < self.checked_replies {
                    return Err(Failure::Error(NodeError::Connect(format!(
                        "{} {}",
                        e.code(),
                        e.details().unwrap_or("")
                    ))));
                }
                // SCRIPT LOAD refused (an ACL, say): scripts go as EVAL.
                scripts = 0;
            }
        }
        // The last handshake reply is INFO server: the restarted-node guard,
        // then one vote per server process.
        let info = recv(&mut writer)?;
        if let Some(grace) = self.restart_grace {
            restart_guard::check(&info, grace).map_err(Failure::Error)?;
        }
        self.servers
            .claim(&info, self.index, &self.name)
            .map_err(Failure::Error)?;
        Ok((writer, reader, scripts))
    }

    /// Connects through the `redis` crate (TLS), within `limit`.
    fn connect_whole(&self, limit: Duration) -> Result<redis::Connection, Failure> {
        // rustls panics when the application selected no crypto provider.
        // A panic here would also leave this node's roles taken for every
        // other thread: turn it into this node's failure.
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.client.get_connection_with_timeout(limit)
        }))
        .map_err(|_| {
            Failure::Error(NodeError::Connect(
                "the TLS library panicked while connecting; with the `tls` feature, \
                 select a rustls crypto provider (rustls = { version = \"0.23\", \
                 features = [\"ring\"] }, or CryptoProvider::install_default)"
                    .to_string(),
            ))
        })?
        .map_err(redis_connect_failure)
    }

    /// Resolves the node's host name, then connects to its addresses in
    /// turn, all within `limit`.
    fn connect_resolved(&self, resolver: &Resolver, limit: Duration) -> Result<Stream, Failure> {
        let start = Instant::now();
        let addrs = resolver
            .resolve(limit)
            .map_err(|unresolved| match unresolved {
                Unresolved::TimedOut => Failure::TimedOut,
                Unresolved::Failed(e) => Failure::Error(e),
            })?;
        let mut last = Failure::TimedOut;
        for (i, addr) in addrs.iter().enumerate() {
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Failure::TimedOut);
            }
            match Stream::tcp(addr, share(left, addrs.len() - i)) {
                Ok(stream) => return Ok(stream),
                Err(failure) => last = failure,
            }
        }
        Err(last)
    }
}

/// How a node is reached.
enum Route {
    /// A TCP address.
    Ip(SocketAddr),
    /// A TCP host name, resolved on each connect.
    Name(Resolver),
    /// A Unix socket.
    #[cfg(unix)]
    Unix(std::path::PathBuf),
    /// Through the `redis` crate's own connection (TLS): one that cannot be
    /// split.
    Whole,
}

/// How to reach a Unix socket: our own socket where the OS has them.
#[cfg(unix)]
fn unix_route(path: &Path) -> Route {
    Route::Unix(path.to_path_buf())
}

/// How to reach a Unix socket: through the `redis` crate elsewhere.
#[cfg(not(unix))]
fn unix_route(_: &Path) -> Route {
    Route::Whole
}

/// A new connection's halves.
fn split(stream: Stream) -> Result<(Writer, Option<Reader>), Failure> {
    let (writer, reader) = stream.split()?;
    Ok((writer, Some(reader)))
}

/// How long to try the next of `remaining` addresses, with `left` for all:
/// an equal share, so that an address that never answers (an IPv6 route
/// that drops packets, say) leaves time for the ones after it.
fn share(left: Duration, remaining: usize) -> Duration {
    left / u32::try_from(remaining.max(1)).unwrap_or(u32::MAX)
}

/// Fails `ticket` if its epoch has ended.
fn check(st: &State, ticket: Ticket) -> Result<(), Failure> {
    if st.epoch == ticket.epoch {
        return Ok(());
    }
    Err(match &st.ended {
        Some((epoch, failure)) if *epoch == ticket.epoch => failure.clone(),
        _ => Failure::Error(NodeError::Io(
            "the connection was dropped after an earlier failure".to_string(),
        )),
    })
}

/// Whether a reply says the server does not have the script.
pub(crate) fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// Marks a request's reply as unwanted.
fn give_up(st: &mut State, seq: u64) {
    st.live -= 1;
    if let Some(flag) = seq
        .checked_sub(st.next_read)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| st.abandoned.get_mut(i))
    {
        *flag = true;
    }
}

/// An unread request was answered `NOSCRIPT`: the server lost our scripts
/// (`SCRIPT FLUSH`), so send them as `EVAL` from now on. The request itself
/// is not sent again: it could land behind a later command of ours and undo
/// it. (A release or extension left unread that way did not happen on that
/// node; the key keeps its TTL there. The quorum had already answered.)
fn forget_scripts_if_lost(st: &mut State, reply: &Value) {
    if is_noscript(reply) {
        st.scripts = 0;
    }
}

/// Drops the connection for everyone: every request on it fails.
fn end_epoch(st: &mut State, failure: Failure) {
    if let Some(writer) = &st.writer {
        writer.shutdown();
    }
    if let Some(reader) = &st.reader {
        reader.shutdown();
    }
    st.open = false;
    st.whole = false;
    st.writer = None;
    st.reader = None;
    st.writing = false;
    st.reading = false;
    st.slow = failure == Failure::TimedOut;
    st.ended = Some((st.epoch, failure));
    st.epoch += 1;
    st.scripts = 0;
    st.outbox.clear();
    st.next_seq = 0;
    st.written = 0;
    st.next_read = 0;
    st.replies.clear();
    st.abandoned.clear();
    st.live = 0;
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

/// Whether a thread may take the reading role now.
fn can_read(st: &State) -> bool {
    !st.reading && (!st.whole || !st.writing)
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
    fn each_address_gets_an_equal_share_of_the_time_left_and_the_last_gets_all() {
        let left = Duration::from_millis(90);
        assert_eq!(share(left, 3), Duration::from_millis(30));
        assert_eq!(share(left, 1), left);
        assert_eq!(share(left, 0), left);
    }

    #[test]
    fn parse_reads_address_auth_and_db() {
        let node = Node::parse("redis://u:p@127.0.0.1:7001/3").unwrap();
        assert_eq!(&**node.name(), "127.0.0.1:7001");
        assert_eq!(node.checked_replies, 2);
        let node = Node::parse("redis+unix:///tmp/x.sock").unwrap();
        assert_eq!(&**node.name(), "/tmp/x.sock");
        assert_eq!(node.checked_replies, 0);
    }
}
