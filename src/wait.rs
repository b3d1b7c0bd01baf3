//! Wake-up hints on release ([`Patience`](crate::Patience#waiting-for-a-release)
//! has the rules; [`script::RELEASE`](crate::store::script::RELEASE), what is
//! published). A client listens on one node at a time, over one
//! subscription connection shared by its waiting threads: its *line*.
//!
//! These are hints: a woken waiter runs an ordinary attempt, so safety
//! never depends on them. A spurious one (a stale message, our own release
//! heard back) costs an attempt.
//!
//! - A waiter counts from the start of its attempt ([`Waiters::listen`]). A
//!   message during the attempt ends the wait after it at once.
//! - A message wakes one waiter of its resource, the first registered: one
//!   lock to take, no stampede. A confirmed subscription wakes all the
//!   channel's waiters, since a release before it went unheard.
//! - The first waiter that needs the line opens it. It moves on to the next
//!   node after a failed connect, a refused subscription, or no answer
//!   within `io_timeout`. A quiet line is checked with `PING`.
//! - Once every node failed in a row, waiters just sleep their pause. The
//!   backoff doubles from [`BACKOFF`] to [`MAX_BACKOFF`] until a
//!   subscription is confirmed.
//! - A channel unwaited for [`LINGER`] is unsubscribed when a waiter comes.
//!   The client's next operation closes a line idle that long.
//! - No background thread: waiters take turns reading the line, in slices
//!   of at most `io_timeout`.
//!
//! The bookkeeping ([`Hints`]) is plain data, apart from the sockets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::Failure;
use crate::node::{Listener, Message, Node, Sender};
use crate::sync::lock;
use crate::time::random_below;

/// How long a channel stays subscribed, and the line open, after the last
/// waiter left. Back-to-back waits, usual under contention, find it ready.
const LINGER: Duration = Duration::from_secs(1);

/// The first backoff once every node failed to serve the line in a row.
const BACKOFF: Duration = Duration::from_secs(1);

/// The longest backoff. A user may get channel permissions later.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A thread woken by a node's message first waits a random share of this.
/// Waiters woken by one release then spread out, instead of splitting the
/// nodes' votes. That holds across clients, and for a release and its echo.
const WAKE_SPREAD: Duration = Duration::from_micros(500);

/// The waiting threads of one client, and its line.
pub(crate) struct Waiters {
    state: Mutex<Hints>,
    /// Signalled when a waiter wakes, the reader or the line frees up, or a line opens.
    changed: Condvar,
    /// Whether there is a line or a waiter; if not, fast paths take no lock.
    active: AtomicBool,
    io_timeout: Duration,
    connect_timeout: Duration,
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A node's message: a release heard of, or the subscription came up.
    Heard,
    /// This client released a resource.
    ReleasedHere,
    /// The pause ended.
    TimedOut,
}

/// A waiter registered as its attempt started. The wait after the attempt
/// takes it over. Dropped unused (the attempt won), it unregisters.
pub(crate) struct Listening<'a> {
    waiters: &'a Waiters,
    id: Option<u64>,
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            lock(&self.waiters.state).unregister(id, Instant::now());
            self.waiters.changed.notify_all();
        }
    }
}

type Guard<'a> = MutexGuard<'a, Hints>;

/// What to send on the line: commands (`SUBSCRIBE`, `UNSUBSCRIBE`, `PING`),
/// each with a resource (none for a `PING`).
type Out = Vec<(&'static str, String)>;

/// The waiters, their channels and the line's state: plain data, apart
/// from the line's sockets.
#[derive(Default)]
struct Hints {
    nodes: usize,
    waiters: Vec<Waiter>,
    next_id: u64,
    /// The resources the line listens (or asked to) for, with when a waiter last came or left.
    channels: HashMap<String, Instant>,
    line: LineState,
    /// The line's sender, and its listener unless a thread reads with it.
    /// Only the reader drops them meanwhile; others mark the line overdue.
    /// So the listener it brings back is this line's.
    sockets: Option<(Sender, Option<Listener>)>,
    /// When the line was last heard, and when its owed answer is overdue.
    heard: Option<Instant>,
    due: Option<Instant>,
    /// The node to listen on next.
    node: usize,
    failed_in_row: usize,
    /// The next backoff once every node failed in a row.
    backoff: Duration,
    connect_after: Option<Instant>,
    /// The connections cannot be split (TLS): no line. Waiters hear only of
    /// this client's releases.
    unsupported: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum LineState {
    #[default]
    Down,
    Connecting,
    Up,
}

struct Waiter {
    id: u64,
    resources: Vec<String>,
    woken: Option<Wake>,
}

impl Waiters {
    pub(crate) fn new(nodes: usize, io_timeout: Duration, connect_timeout: Duration) -> Waiters {
        Waiters {
            state: Mutex::new(Hints::new(nodes)),
            changed: Condvar::new(),
            active: AtomicBool::new(false),
            io_timeout,
            connect_timeout,
        }
    }

    /// Called as an attempt on `resources` starts. If the line listens for
    /// them all, a message from now on counts for the wait after it. Free
    /// while the client has no line.
    pub(crate) fn listen(&self, resources: &[String]) -> Listening<'_> {
        let id = self.tidy().and_then(|(mut st, now)| {
            let listens = st.listens_for(resources);
            listens.then(|| st.register(resources, now, self.io_timeout).0)
        });
        Listening { waiters: self, id }
    }

    /// This client released `resources`: wakes one of its waiters of each.
    pub(crate) fn released(&self, resources: &[String]) {
        if self.active.load(Ordering::Acquire) && lock(&self.state).released_here(resources) {
            self.changed.notify_all();
        }
    }

    /// Waits after the attempt `listening` began. It ends on a release of
    /// one of `resources`, at `until`, or when `stop` says so. A stop reads
    /// as a timeout; whoever sets it calls [`nudge`](Self::nudge). Never
    /// past `until`, give or take a read's socket timeout.
    pub(crate) fn wait(
        &self,
        mut listening: Listening<'_>,
        nodes: &[Node],
        resources: &[String],
        until: Instant,
        stop: &dyn Fn() -> bool,
    ) -> Wake {
        let mut st = lock(&self.state);
        self.active.store(true, Ordering::Release);
        let id = *(listening.id)
            .get_or_insert_with(|| st.register(resources, Instant::now(), self.io_timeout).0);
        loop {
            if let Some(wake) = st.woken(id) {
                drop(st);
                if wake == Wake::Heard {
                    let left = until.saturating_duration_since(Instant::now());
                    std::thread::sleep(random_below(WAKE_SPREAD).min(left));
                }
                return wake;
            }
            let now = Instant::now();
            if now >= until || stop() {
                return Wake::TimedOut;
            }
            if st.may_connect(now) {
                st = self.connect(st, nodes, until);
                continue;
            }
            if let Some(listener) = st.sockets.as_mut().and_then(|(_, l)| l.take()) {
                st = self.read(st, listener, until);
                continue;
            }
            // Another thread reads or connects, or no node serves: sleep.
            let left = st.sleep_for(now, until);
            let slept = self.changed.wait_timeout(st, left);
            st = slept.map_or_else(|e| e.into_inner().0, |r| r.0);
        }
    }

    /// Wakes every waiting thread to look at its `stop` again.
    pub(crate) fn nudge(&self) {
        let _st = lock(&self.state);
        self.changed.notify_all();
    }

    /// Reads the line outside the lock, until `until` at most, and records what it heard.
    fn read<'a>(&'a self, st: Guard<'a>, mut listener: Listener, until: Instant) -> Guard<'a> {
        let read_until = st.read_deadline(Instant::now(), until, self.io_timeout);
        drop(st);
        let heard = listener.next(read_until);
        let (mut st, now) = (lock(&self.state), Instant::now());
        let news = match heard {
            Ok(message) => st.on_message(message, now),
            Err(Failure::TimedOut) if !st.overdue(now) => false,
            Err(_) => st.line_failed(now),
        };
        let up = st.line == LineState::Up;
        match &mut st.sockets {
            Some((_, slot)) if up => *slot = Some(listener),
            sockets => *sockets = None,
        }
        if news {
            self.changed.notify_all();
        }
        st
    }

    /// Opens a line to the next node, outside the lock. A connect cut short
    /// by the waiter's own pause says nothing about the node.
    fn connect<'a>(&'a self, mut st: Guard<'a>, nodes: &[Node], until: Instant) -> Guard<'a> {
        st.line = LineState::Connecting;
        let node = st.node;
        drop(st);
        let cut_by_pause = until < Instant::now() + self.connect_timeout;
        let opened = nodes[node].subscribe_line(until, self.connect_timeout);
        let (mut st, now) = (lock(&self.state), Instant::now());
        st.line = LineState::Down;
        match opened {
            Ok(Some((sender, listener))) => {
                st.sockets = Some((sender, Some(listener)));
                st.line_opened(now, self.io_timeout);
            }
            Ok(None) => st.unsupported = true,
            Err(Failure::TimedOut | Failure::ConnectTimedOut) if cut_by_pause => {}
            Err(_) => _ = st.line_failed(now),
        }
        self.changed.notify_all();
        st
    }

    /// Closes the line if no thread has waited for [`LINGER`]. Extensions
    /// and releases call it, as they do not [`listen`](Self::listen). A
    /// client that only holds locks keeps no line open. Free while the
    /// client has no line.
    pub(crate) fn close_if_idle(&self) {
        drop(self.tidy());
    }

    /// The state once the line is closed if idle, unless the client has
    /// neither a line nor a waiter: then `None`, and no lock taken.
    fn tidy(&self) -> Option<(Guard<'_>, Instant)> {
        let active = self.active.load(Ordering::Acquire);
        let (mut st, now) = (active.then(|| lock(&self.state))?, Instant::now());
        if st.close_if_idle(now) {
            self.active.store(false, Ordering::Release);
        }
        Some((st, now))
    }
}

impl Hints {
    fn new(nodes: usize) -> Hints {
        Hints {
            nodes: nodes.max(1),
            backoff: BACKOFF,
            ..Hints::default()
        }
    }

    /// Whether the line is up and listens (or asked to) for all `resources`.
    fn listens_for(&self, resources: &[String]) -> bool {
        self.line == LineState::Up && resources.iter().all(|r| self.channels.contains_key(r))
    }

    /// Adds a waiter for `resources`, and sends what the line needs.
    /// Returns its id, and what was sent.
    fn register(&mut self, resources: &[String], now: Instant, io: Duration) -> (u64, Out) {
        let id = self.next_id;
        self.next_id += 1;
        self.waiters.push(Waiter {
            id,
            resources: resources.to_vec(),
            woken: None,
        });
        (id, self.listen(resources, now, io))
    }

    /// Sends on an up line what it needs to listen for `resources`, and
    /// returns it. That is the missing subscriptions, and unsubscribing
    /// channels unwaited for [`LINGER`]. A line quiet for `io` that owes
    /// nothing also gets a `PING`. The line owes an answer to each.
    fn listen(&mut self, resources: &[String], now: Instant, io: Duration) -> Out {
        if self.line != LineState::Up {
            return Out::new();
        }
        let new = (resources.iter()).filter(|r| self.channels.insert((*r).clone(), now).is_none());
        let mut out: Out = new.map(|r| ("SUBSCRIBE", r.clone())).collect();
        // Unsubscribe the channels nobody waited on for [`LINGER`].
        let waiters = &self.waiters;
        let waited = |r: &String| waiters.iter().any(|w| w.resources.contains(r));
        let stale = (self.channels)
            .extract_if(|r, last| now.saturating_duration_since(*last) >= LINGER && !waited(r));
        out.extend(stale.map(|(resource, _)| ("UNSUBSCRIBE", resource)));
        let quiet = (self.heard).is_none_or(|t| now.saturating_duration_since(t) >= io);
        if self.due.is_none() && quiet {
            out.push(("PING", String::new()));
        }
        if !out.is_empty() {
            self.due = self.due.or(Some(now + io));
            // A failed write leaves the line overdue, so its next read fails it.
            let sender = self.sockets.as_mut().map(|(sender, _)| sender);
            if sender.is_some_and(|sender| sender.send(&out, now + io).is_err()) {
                self.due = Some(now);
            }
        }
        out
    }

    fn unregister(&mut self, id: u64, now: Instant) {
        let gone = self.waiters.extract_if(.., |w| w.id == id);
        // The channels the line listens on linger from now on.
        for resource in gone.flat_map(|w| w.resources) {
            if let Some(last) = self.channels.get_mut(&resource) {
                *last = now;
            }
        }
    }

    fn woken(&self, id: u64) -> Option<Wake> {
        self.waiters.iter().find(|w| w.id == id)?.woken
    }

    /// Wakes up to `most` waiters for `resource` that are not awake, first
    /// come first. Returns whether it woke any.
    fn wake(&mut self, resource: &str, why: Wake, most: usize) -> bool {
        let asleep = (self.waiters.iter_mut())
            .filter(|w| w.woken.is_none() && w.resources.iter().any(|r| r == resource));
        asleep.take(most).map(|w| w.woken = Some(why)).count() > 0
    }

    /// This client released `resources`: wakes one waiter of each. Returns whether it woke any.
    fn released_here(&mut self, resources: &[String]) -> bool {
        let woke = (resources.iter()).filter(|r| self.wake(r, Wake::ReleasedHere, 1));
        woke.count() > 0
    }

    /// What the line said. Returns whether other threads should look.
    fn on_message(&mut self, message: Message, now: Instant) -> bool {
        (self.heard, self.due) = (Some(now), None);
        match message {
            Message::Released(resource) => self.wake(&resource, Wake::Heard, 1),
            Message::Subscribed(resource) => {
                (self.failed_in_row, self.backoff) = (0, BACKOFF);
                self.wake(&resource, Wake::Heard, usize::MAX)
            }
            Message::Answer => false,
        }
    }

    /// When the reader must be back: at the end of its pause, when an answer
    /// is due, or after `io` at most. The last checks in time what others
    /// send meanwhile.
    fn read_deadline(&self, now: Instant, until: Instant, io: Duration) -> Instant {
        self.due.into_iter().fold(until.min(now + io), Instant::min)
    }

    /// The line owes an answer it should have given by now.
    fn overdue(&self, now: Instant) -> bool {
        self.due.is_some_and(|due| now >= due)
    }

    /// Whether a waiter may open a line now.
    fn may_connect(&self, now: Instant) -> bool {
        self.line == LineState::Down
            && !self.unsupported
            && self.connect_after.is_none_or(|t| now >= t)
    }

    /// How long a waiter that neither reads nor connects sleeps: to the end
    /// of its pause, or of a backoff still ahead. A backoff already over is
    /// no reason to wake: whoever connects or reads says when done.
    fn sleep_for(&self, now: Instant, until: Instant) -> Duration {
        let end = match self.connect_after {
            Some(after) if after > now && self.line == LineState::Down => after.min(until),
            _ => until,
        };
        end.saturating_duration_since(now)
    }

    /// A line is open: every resource waited on is subscribed. Returns
    /// what was sent.
    fn line_opened(&mut self, now: Instant, io: Duration) -> Out {
        self.channels.clear();
        (self.line, self.heard, self.due) = (LineState::Up, Some(now), None);
        self.connect_after = None;
        let waited = self.waiters.iter().flat_map(|w| w.resources.clone());
        self.listen(&waited.collect::<Vec<_>>(), now, io)
    }

    /// The line or its connect failed: move to the next node. Its
    /// subscriptions will wake the waiters. Once all failed in a row, wait a
    /// backoff twice the last. Returns true: the other threads should look.
    fn line_failed(&mut self, now: Instant) -> bool {
        (self.line, self.node) = (LineState::Down, (self.node + 1) % self.nodes);
        self.failed_in_row += 1;
        if self.failed_in_row >= self.nodes {
            self.failed_in_row = 0;
            self.connect_after = Some(now + self.backoff);
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
        true
    }

    /// Forgets the line, its sockets and its channels if no thread has
    /// waited for [`LINGER`]. Returns whether it did.
    fn close_if_idle(&mut self, now: Instant) -> bool {
        let idle = |&last: &Instant| now.saturating_duration_since(last) >= LINGER;
        let close = self.waiters.is_empty()
            && self.line != LineState::Connecting
            && self.channels.values().all(idle);
        if close {
            (self.line, self.sockets) = (LineState::Down, None);
            self.channels.clear();
        }
        close
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IO: Duration = Duration::from_millis(50);

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn subscribed(resource: &str) -> Message {
        Message::Subscribed(resource.to_string())
    }

    fn message(resource: &str) -> Message {
        Message::Released(resource.to_string())
    }

    /// Hints with a line up and `resource` confirmed on it.
    fn listening(resource: &str, now: Instant) -> Hints {
        let mut hints = Hints::new(3);
        let (id, _) = hints.register(&names(&[resource]), now, IO);
        hints.line_opened(now, IO);
        hints.on_message(subscribed(resource), now);
        hints.unregister(id, now);
        hints
    }

    #[test]
    fn a_message_wakes_one_waiter_of_its_resource() {
        let now = Instant::now();
        let mut hints = listening("a", now);
        let (first, _) = hints.register(&names(&["a"]), now, IO);
        let (second, _) = hints.register(&names(&["a"]), now, IO);
        let (other, _) = hints.register(&names(&["b"]), now, IO);
        assert!(hints.on_message(message("a"), now));
        assert_eq!(hints.woken(first), Some(Wake::Heard));
        assert_eq!(hints.woken(second), None, "one lock to take, one waiter");
        assert_eq!(hints.woken(other), None);
        assert!(hints.on_message(message("a"), now));
        assert_eq!(hints.woken(second), Some(Wake::Heard));
        assert!(
            !hints.on_message(message("zzz"), now),
            "nobody waits for it"
        );
    }

    #[test]
    fn a_confirmed_subscription_wakes_every_waiter_of_its_channel() {
        let now = Instant::now();
        let mut hints = Hints::new(3);
        let (a1, _) = hints.register(&names(&["a"]), now, IO);
        let (a2, _) = hints.register(&names(&["a", "b"]), now, IO);
        let (b, _) = hints.register(&names(&["b"]), now, IO);
        let mut out = hints.line_opened(now, IO);
        out.sort();
        assert_eq!(out, [("SUBSCRIBE", "a".into()), ("SUBSCRIBE", "b".into())]);
        assert!(hints.on_message(subscribed("a"), now));
        assert_eq!(hints.woken(a1), Some(Wake::Heard));
        assert_eq!(hints.woken(a2), Some(Wake::Heard));
        assert_eq!(hints.woken(b), None);
    }

    #[test]
    fn a_release_through_the_client_wakes_one_waiter_without_the_network() {
        let now = Instant::now();
        let mut hints = Hints::new(3);
        let (a1, _) = hints.register(&names(&["a"]), now, IO);
        let (a2, _) = hints.register(&names(&["a"]), now, IO);
        assert_eq!(hints.line, LineState::Down);
        assert!(hints.released_here(&names(&["a"])));
        assert_eq!(hints.woken(a1), Some(Wake::ReleasedHere));
        assert_eq!(hints.woken(a2), None);
        assert!(!hints.released_here(&names(&["b"])));
    }

    #[test]
    fn a_watch_counts_only_where_the_line_listens_already() {
        let now = Instant::now();
        let hints = listening("a", now);
        assert!(hints.listens_for(&names(&["a"])));
        assert!(!hints.listens_for(&names(&["a", "b"])));
        assert!(!Hints::new(3).listens_for(&names(&["a"])));
    }

    #[test]
    fn no_busy_waiting_once_a_backoff_is_over() {
        let now = Instant::now();
        let until = now + Duration::from_secs(4);
        let mut hints = Hints::new(1);
        hints.line_failed(now);
        let after = hints.connect_after.expect("every node failed: a backoff");
        assert_eq!(hints.sleep_for(now, until), after - now);
        assert!(!hints.may_connect(now));
        // The backoff is over, and another thread connects (or reads): the
        // waiters that do neither sleep until their pause ends (or news).
        let later = after + Duration::from_millis(1);
        assert!(hints.may_connect(later));
        hints.line = LineState::Connecting;
        assert_eq!(hints.sleep_for(later, until), until - later);
        hints.line_opened(later, IO);
        assert_eq!(hints.sleep_for(later, until), until - later);
    }

    #[test]
    fn the_backoff_doubles_each_time_every_node_failed_until_a_subscription_is_confirmed() {
        let mut now = Instant::now();
        let mut hints = Hints::new(2);
        let (id, _) = hints.register(&names(&["a"]), now, IO);
        let mut backoffs = Vec::new();
        for _ in 0..16 {
            hints.line_opened(now, IO);
            // The node refuses the subscription (no channel permissions).
            hints.line_failed(now);
            if let Some(after) = hints.connect_after.filter(|&t| t > now) {
                backoffs.push(after - now);
                now = after;
            }
        }
        assert_eq!(backoffs.len(), 8, "a backoff once both nodes failed");
        let secs: Vec<u64> = backoffs.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
        hints.line_opened(now, IO);
        hints.on_message(subscribed("a"), now);
        assert_eq!(hints.woken(id), Some(Wake::Heard));
        assert_eq!(hints.backoff, BACKOFF, "a confirmed subscription resets it");
    }

    #[test]
    fn a_quiet_line_is_pinged_and_fails_when_the_answer_is_overdue() {
        let now = Instant::now();
        let mut hints = listening("a", now);
        let ping = ("PING", String::new());
        let (_, out) = hints.register(&names(&["a"]), now, IO);
        assert!(out.is_empty(), "heard just now");
        let quiet = now + IO;
        let (_, out) = hints.register(&names(&["a"]), quiet, IO);
        assert_eq!(out, [ping]);
        let (_, out) = hints.register(&names(&["a"]), quiet, IO);
        assert!(out.is_empty(), "one PING at a time");
        assert!(!hints.overdue(quiet));
        assert_eq!(hints.read_deadline(quiet, quiet + IO * 10, IO), quiet + IO);
        assert!(hints.overdue(quiet + IO));
        hints.on_message(Message::Answer, quiet);
        assert!(!hints.overdue(quiet + IO));
    }

    #[test]
    fn a_subscription_unanswered_in_time_fails_the_line() {
        let now = Instant::now();
        let mut hints = listening("a", now);
        let (_, out) = hints.register(&names(&["b"]), now, IO);
        assert_eq!(out, [("SUBSCRIBE", "b".into())]);
        assert!(!hints.overdue(now + IO / 2));
        assert!(hints.overdue(now + IO));
    }

    #[test]
    fn a_channel_nobody_waited_on_for_a_while_is_unsubscribed() {
        let now = Instant::now();
        let mut hints = listening("a", now);
        let (_, out) = hints.register(&names(&["b"]), now, IO);
        assert_eq!(out, [("SUBSCRIBE", "b".into())], "a lingers");
        let (_, out) = hints.register(&names(&["b"]), now + LINGER, IO);
        assert_eq!(out, [("UNSUBSCRIBE", "a".into())]);
        assert!(!hints.channels.contains_key("a"));
    }

    #[test]
    fn the_line_closes_once_no_thread_waited_for_a_while() {
        let now = Instant::now();
        let mut hints = listening("a", now);
        assert!(!hints.close_if_idle(now));
        assert!(hints.close_if_idle(now + LINGER));
        assert_eq!(hints.line, LineState::Down);
        assert!(hints.channels.is_empty());
    }
}
