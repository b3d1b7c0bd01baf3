//! Waiting for a release instead of sleeping out the retry pause.
//!
//! Every release (the release script) also `PUBLISH`es the token on the
//! resource's channel (`redlock-sync:released:<resource>`) on each node it
//! deletes the key from. A client whose attempt found the lock held listens
//! on one node for those messages, and its waiting thread retries as soon as
//! one comes for its resource, or when its retry pause ends, whichever is
//! first. A release through the same client wakes its own waiters at once,
//! without the network.
//!
//! Notifications are hints. Safety never depends on them: a woken waiter
//! runs an ordinary attempt. A missed one costs at most the retry pause,
//! which still bounds every wait (a holder that crashed is found when its
//! key expires, as before); a spurious one costs an attempt, and a second
//! one about `io_timeout` later if the first lost (see
//! `Redlock::acquire_loop`).
//!
//! # The subscription connection ("line")
//!
//! One per client, to one node at a time, shared by all its waiting threads;
//! opened by the first waiter that needs it, closed by the client's next
//! operation once no thread has waited for [`LINGER`], or when the client is
//! dropped. Every release publishes on every node it reaches, so one healthy
//! node is enough; a node whose connect fails, or that does not confirm a
//! subscription or answer a `PING` within `io_timeout`, is left for the next
//! one. No background thread: the waiting threads take turns at the reader
//! role. At most one holds the line's [`Listener`] (taken out of the state
//! while it reads, so others can still subscribe through the sender); it
//! reads in slices of at most `io_timeout` and puts the listener back when
//! it leaves. What the socket holds meanwhile waits for the next reader.
//!
//! # Which messages count for whom
//!
//! A waiter must not miss a release that came after its attempt started,
//! and should not wake for one that came before. [`Waiters::watch`], called
//! as an attempt starts, remembers where the line's stream was:
//! - with a live reader, a stamp: every change to a channel (a message, a
//!   confirmed subscription, a release through this client) gets a new,
//!   higher stamp from one counter, so a channel whose stamp passed the
//!   watch's changed after it;
//! - with no live reader (the socket may hold old messages), a `PING`: what
//!   the line delivers before its answer was published before the attempt
//!   started (on that node), and is not news to this waiter.
//!
//! A waiter whose channels were not all subscribed when its attempt started
//! wakes once they are (a release in between would be lost): an attempt
//! more (two, if it lost: news may have come just before it), then it
//! waits with a sound reference.
//!
//! # No stampede
//!
//! A message wakes one waiter of the client (the first registered that
//! waits for that resource), not all; a release through the client wakes
//! one of its own. A thread woken by the network waits a random
//! [`WAKE_SPREAD`] fraction first, so that the waiters of several clients
//! do not all hit the nodes in the same instant. No fairness, no FIFO order
//! across clients.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::client::config::Config;
use crate::error::Failure;
use crate::node::{Event, Listener, Node, Sender};
use crate::script::{CLEAN_UP_MARK, RELEASED_CHANNEL_PREFIX};

/// How long a channel stays subscribed, and the line open, after the last
/// thread that waited on it left: back-to-back waits (the usual case under
/// contention) then find it ready, and need no attempt more.
const LINGER: Duration = Duration::from_secs(1);

/// After every node failed to serve a subscription in a row, how long
/// waiters only sleep their pause before trying nodes again.
const BACKOFF: Duration = Duration::from_secs(1);

/// A thread woken by a node's message waits a random share of this before
/// its attempt: the waiters of several clients woken by one release spread
/// out instead of splitting the nodes' votes among them.
const WAKE_SPREAD: Duration = Duration::from_micros(500);

/// How many of this client's releases whose message is still to come (and
/// is to be ignored: its waiters were woken already) are remembered.
const MAX_ECHOES: usize = 64;

/// How many `PING` answers remember the stamp they came at.
const PONG_HISTORY: usize = 32;

/// The waiting threads of one client, and its subscription line.
pub(crate) struct Waiters {
    state: Mutex<State>,
    /// Signalled when a waiter is woken, the reader role or the line frees
    /// up, or a line opens.
    changed: Condvar,
    /// Whether there is a line or a waiter at all: when there is not, the
    /// fast paths ([`watch`](Self::watch), [`released`](Self::released))
    /// take no lock.
    active: AtomicBool,
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A node said a resource was released.
    Released,
    /// A node said another client's failed attempt gave a resource's key
    /// back (its clean-up): a weaker hint, as that attempt may have lost to
    /// a holder that still holds the lock.
    CleanedUp,
    /// This client released a resource.
    ReleasedHere,
    /// The subscription became ready after the attempt started: a release
    /// in between would have gone unseen, so look again.
    Subscribed,
    /// The pause ended.
    TimedOut,
}

/// Where the line's stream was when an attempt started.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Watch {
    /// The highest stamp among the resources' channels, if all of them were
    /// subscribed.
    stamp: Option<u64>,
    /// The line (its epoch) and the number of the `PING` sent, when no
    /// reader was live.
    marker: Option<(u64, u64)>,
}

struct State {
    nodes: usize,
    waiters: Vec<Waiter>,
    next_id: u64,
    /// By resource name.
    channels: HashMap<String, Channel>,
    /// The last stamp given out.
    stamp: u64,
    line: Option<Line>,
    /// Counts the lines opened: a watch on an earlier line says nothing.
    epoch: u64,
    /// A thread is opening a line.
    connecting: bool,
    /// The node to listen on next.
    node: usize,
    failed_in_row: usize,
    connect_after: Option<Instant>,
    /// When the last waiter left.
    idle_since: Option<Instant>,
    /// Tokens of this client's releases whose message is still to come.
    echoes: VecDeque<Vec<u8>>,
    /// The nodes' connections cannot be split (TLS): waiters only sleep.
    unsupported: bool,
}

struct Waiter {
    id: u64,
    resources: Vec<String>,
    woken: Option<Wake>,
    /// Its channels are not all subscribed: it wakes once they are.
    needs_confirm: bool,
    /// The `PING` whose answer is still to come before messages count for
    /// this waiter.
    marker: Option<u64>,
    /// Clean-up messages do not wake it: one already did in this pause,
    /// and the attempt it brought failed. (Two waiting clients whose
    /// clean-ups wake each other would otherwise try again and again while
    /// the lock stays held.)
    deaf_to_clean_ups: bool,
}

/// The subscription connection.
struct Line {
    sender: Sender,
    /// Taken by the thread in the reader role.
    listener: Option<Listener>,
    heard: Instant,
    /// The client's `io_timeout`: how long the node has to answer.
    io: Duration,
    pings: u64,
    pongs: u64,
    /// When the oldest unanswered `PING` is overdue.
    ping_due: Option<Instant>,
    /// The stamp each of the last `PING` answers came at.
    pong_stamps: VecDeque<(u64, u64)>,
}

struct Channel {
    sub: Sub,
    /// The stamp of its last change.
    stamp: u64,
    /// The stamp of the last release of it through this client.
    released_here: u64,
    waiters: usize,
    /// When its last waiter left.
    left: Instant,
}

/// A channel's subscription on the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    /// Not asked for on this line (or there is no line).
    Unsent,
    /// `SUBSCRIBE` sent; the node must confirm by `due`.
    Sent {
        due: Instant,
    },
    Confirmed,
    /// `UNSUBSCRIBE` sent.
    Leaving,
}

impl Waiters {
    /// No line, no waiter. The first line goes to the first node (the
    /// next one after a node fails us): every release publishes on every
    /// node, so which one does not matter while it is healthy.
    pub(crate) fn new(nodes: usize) -> Waiters {
        Waiters {
            state: Mutex::new(State {
                nodes: nodes.max(1),
                waiters: Vec::new(),
                next_id: 0,
                channels: HashMap::new(),
                stamp: 0,
                line: None,
                epoch: 0,
                connecting: false,
                node: 0,
                failed_in_row: 0,
                connect_after: None,
                idle_since: None,
                echoes: VecDeque::new(),
                unsupported: false,
            }),
            changed: Condvar::new(),
            active: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called as an attempt on `resources` starts: what a wait after it
    /// compares with. Costs nothing while the client has no line.
    pub(crate) fn watch(&self, resources: &[String]) -> Watch {
        if !self.active.load(Ordering::Acquire) {
            return Watch::default();
        }
        let mut st = self.lock();
        let now = Instant::now();
        self.tidy(&mut st, now);
        let stamp = st.confirmed_stamp(resources);
        let mut marker = None;
        if stamp.is_some() {
            let epoch = st.epoch;
            if let Some(line) = st.line.as_mut().filter(|l| l.listener.is_some()) {
                match line.ping(now) {
                    Ok(k) => marker = Some((epoch, k)),
                    Err(_) => st.fail_line(now),
                }
            }
        }
        Watch { stamp, marker }
    }

    /// After this client released `resources` (the lock's `token`, as hex),
    /// `published(i)` saying whether node `i` deleted the keys (and so
    /// published): wakes one of its waiters of each, at once.
    pub(crate) fn released(
        &self,
        resources: &[String],
        token: &[u8],
        published: impl Fn(usize) -> bool,
    ) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        for resource in resources {
            let Some(channel) = st.channels.get_mut(resource) else {
                continue;
            };
            st.stamp += 1;
            channel.stamp = st.stamp;
            channel.released_here = st.stamp;
            st.wake_one(resource, Wake::ReleasedHere, |_| true);
        }
        // Its message will come too: the waiter it would wake is awake.
        st.expect_echoes(resources, token, published);
        drop(guard);
        self.changed.notify_all();
    }

    /// After a failed attempt of this client with `token` was cleaned up,
    /// `cleaned(i)` saying whether node `i` may have held its keys: the
    /// messages of that clean-up are no news to anyone here (it was this
    /// client's own key that went away), and must not wake the thread that
    /// sent it straight back to the nodes, attempt after attempt.
    pub(crate) fn cleaned_up(
        &self,
        resources: &[String],
        token: &[u8],
        cleaned: impl Fn(usize) -> bool,
    ) {
        if self.active.load(Ordering::Acquire) {
            self.lock().expect_echoes(resources, token, cleaned);
        }
    }

    /// Waits until a release of one of `resources` is heard of (after the
    /// attempt that `watch` began), or until `until`, or until `stop` says
    /// so (then as if timed out; whoever makes `stop` true calls
    /// [`nudge`](Self::nudge) after). Never past `until`, give or take a
    /// read's socket timeout.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn wait(
        &self,
        nodes: &[Node],
        config: &Config,
        resources: &[String],
        watch: Watch,
        until: Instant,
        deaf_to_clean_ups: bool,
        stop: &dyn Fn() -> bool,
    ) -> Wake {
        let mut st = self.lock();
        if st.unsupported {
            while !stop() && Instant::now() < until {
                let left = until.saturating_duration_since(Instant::now());
                st = (self.changed.wait_timeout(st, left))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            return Wake::TimedOut;
        }
        self.active.store(true, Ordering::Release);
        st.idle_since = None;
        let id = st.register(resources, watch, Instant::now(), config.io_timeout);
        if let Some(waiter) = st.waiters.iter_mut().find(|w| w.id == id) {
            waiter.deaf_to_clean_ups = deaf_to_clean_ups;
        }
        let wake = loop {
            if let Some(wake) = st.woken(id) {
                break wake;
            }
            let now = Instant::now();
            if now >= until || stop() {
                break Wake::TimedOut;
            }
            if st.line.is_none() && st.may_connect(now) {
                st = self.connect(st, nodes, config, until);
                continue;
            }
            let epoch = st.epoch;
            if let Some(mut listener) = st.line.as_mut().and_then(|l| l.listener.take()) {
                let read_until = st.read_deadline(now, until, config.io_timeout);
                drop(st);
                let heard = listener.next(read_until);
                st = self.lock();
                if st.heard(epoch, listener, heard, Instant::now()) {
                    self.changed.notify_all();
                }
                continue;
            }
            // Another thread reads or connects, or no node serves: sleep
            // until news or the end of the pause.
            let wake_at = st.connect_after.map_or(until, |t| t.clamp(now, until));
            let left = wake_at.saturating_duration_since(now);
            st = self
                .changed
                .wait_timeout(st, left.max(Duration::from_micros(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        let now = Instant::now();
        st.unregister(id, now);
        drop(st);
        // The reader role may be free now, and others may be woken.
        self.changed.notify_all();
        if matches!(wake, Wake::Released | Wake::CleanedUp) {
            let spread = random_below(WAKE_SPREAD);
            let left = until.saturating_duration_since(Instant::now());
            std::thread::sleep(spread.min(left));
        }
        wake
    }

    /// Wakes every waiting thread to look at its `stop` again.
    pub(crate) fn nudge(&self) {
        let _st = self.lock();
        self.changed.notify_all();
    }

    /// Opens a line to the next node, outside the lock. A connect that the
    /// waiter's own pause cut short says nothing about the node.
    fn connect<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        nodes: &[Node],
        config: &Config,
        until: Instant,
    ) -> MutexGuard<'a, State> {
        st.connecting = true;
        let node = st.node;
        drop(st);
        let cut_by_pause = until < Instant::now() + config.connect_timeout;
        let opened = nodes[node].subscribe_line(until, config.connect_timeout);
        let mut st = self.lock();
        st.connecting = false;
        let now = Instant::now();
        match opened {
            Ok(Some((sender, listener))) => {
                st.epoch += 1;
                st.line = Some(Line {
                    sender,
                    listener: Some(listener),
                    heard: now,
                    io: config.io_timeout,
                    pings: 0,
                    pongs: 0,
                    ping_due: None,
                    pong_stamps: VecDeque::new(),
                });
                st.subscribe_unsent(now, config.io_timeout);
            }
            Ok(None) => st.unsupported = true,
            Err(Failure::TimedOut | Failure::ConnectTimedOut) if cut_by_pause => {}
            Err(_) => st.next_node(now),
        }
        drop(st);
        self.changed.notify_all();
        self.lock()
    }

    /// Closes the line if no thread has waited for [`LINGER`]: for the
    /// client's operations that do not [`watch`](Self::watch) (extensions
    /// and releases), so that a client that stopped waiting and goes on
    /// only holding its locks does not keep the line open. Costs nothing
    /// while the client has no line.
    pub(crate) fn close_if_idle(&self) {
        if self.active.load(Ordering::Acquire) {
            self.tidy(&mut self.lock(), Instant::now());
        }
    }

    /// Closes the line once no thread has waited for [`LINGER`].
    fn tidy(&self, st: &mut State, now: Instant) {
        let idle = st
            .idle_since
            .is_some_and(|since| now.saturating_duration_since(since) >= LINGER);
        if idle && st.waiters.is_empty() && !st.connecting {
            st.line = None;
            st.channels.clear();
            st.echoes.clear();
            st.idle_since = None;
            self.active.store(false, Ordering::Release);
        }
    }
}

impl State {
    /// Adds a waiter for `resources`: subscribes what is missing, and wakes
    /// it at once if its channels changed since `watch`.
    fn register(&mut self, resources: &[String], watch: Watch, now: Instant, io: Duration) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        for resource in resources {
            let channel = self
                .channels
                .entry(resource.clone())
                .or_insert_with(|| Channel {
                    sub: Sub::Unsent,
                    stamp: 0,
                    released_here: 0,
                    waiters: 0,
                    left: now,
                });
            channel.waiters += 1;
            if channel.sub == Sub::Leaving {
                channel.sub = Sub::Unsent;
            }
        }
        self.retire_lingering(now, io);
        self.subscribe_unsent(now, io);
        if let Some(line) = &mut self.line {
            let quiet = now.saturating_duration_since(line.heard) >= io;
            if quiet && line.ping_due.is_none() && line.ping(now).is_err() {
                self.fail_line(now);
            }
        }
        let mut waiter = Waiter {
            id,
            resources: resources.to_vec(),
            woken: None,
            needs_confirm: false,
            marker: None,
            deaf_to_clean_ups: false,
        };
        let here = resources
            .iter()
            .filter_map(|r| self.channels.get(r))
            .map(|c| c.released_here)
            .max()
            .unwrap_or(0);
        match (self.confirmed_stamp(resources), watch.stamp) {
            (None, _) => waiter.needs_confirm = true,
            (Some(_), None) => waiter.woken = Some(Wake::Subscribed),
            (Some(_), Some(seen)) if here > seen => waiter.woken = Some(Wake::ReleasedHere),
            (Some(now_stamp), Some(seen)) => match watch.marker {
                None if now_stamp > seen => waiter.woken = Some(Wake::Released),
                None => {}
                Some((epoch, _)) if epoch != self.epoch => waiter.woken = Some(Wake::Subscribed),
                Some((_, k)) => {
                    let line = self.line.as_ref();
                    if line.is_some_and(|l| l.pongs >= k) {
                        // Changed since the answer to its PING (or too long
                        // ago to tell): look again.
                        let at = line.and_then(|l| l.pong_stamp(k));
                        if at.is_none_or(|at| now_stamp > at) {
                            waiter.woken = Some(Wake::Released);
                        }
                    } else {
                        waiter.marker = Some(k);
                    }
                }
            },
        }
        self.waiters.push(waiter);
        id
    }

    /// Remembers that the messages of `token`'s release of `resources` are
    /// this client's own, if the listened-to node published them.
    fn expect_echoes(
        &mut self,
        resources: &[String],
        token: &[u8],
        published: impl Fn(usize) -> bool,
    ) {
        if self.line.is_none() || !published(self.node) {
            return;
        }
        for resource in resources {
            let listened = self
                .channels
                .get(resource)
                .is_some_and(|c| matches!(c.sub, Sub::Sent { .. } | Sub::Confirmed));
            if listened {
                if self.echoes.len() == MAX_ECHOES {
                    self.echoes.pop_front();
                }
                self.echoes.push_back(token.to_vec());
            }
        }
    }

    fn unregister(&mut self, id: u64, now: Instant) {
        let Some(at) = self.waiters.iter().position(|w| w.id == id) else {
            return;
        };
        let waiter = self.waiters.remove(at);
        for resource in &waiter.resources {
            if let Some(channel) = self.channels.get_mut(resource) {
                channel.waiters -= 1;
                channel.left = now;
            }
        }
        if self.line.is_none() {
            self.channels.retain(|_, c| c.waiters > 0);
        }
        if self.waiters.is_empty() {
            self.idle_since = Some(now);
        }
    }

    fn woken(&self, id: u64) -> Option<Wake> {
        self.waiters.iter().find(|w| w.id == id)?.woken
    }

    /// Wakes the first waiter for `resource` that is not awake and that
    /// `eligible` admits. Returns whether it woke one.
    fn wake_one(&mut self, resource: &str, why: Wake, eligible: impl Fn(&Waiter) -> bool) -> bool {
        let found = self.waiters.iter_mut().find(|w| {
            w.woken.is_none() && w.resources.iter().any(|r| r == resource) && eligible(w)
        });
        match found {
            Some(waiter) => {
                waiter.woken = Some(why);
                true
            }
            None => false,
        }
    }

    /// The highest stamp among `resources`' channels if all of them are
    /// confirmed on the line.
    fn confirmed_stamp(&self, resources: &[String]) -> Option<u64> {
        self.line.as_ref()?;
        resources.iter().try_fold(0, |max, r| {
            let channel = self.channels.get(r)?;
            (channel.sub == Sub::Confirmed).then_some(max.max(channel.stamp))
        })
    }

    fn next_stamp(&mut self) -> u64 {
        self.stamp += 1;
        self.stamp
    }

    fn may_connect(&self, now: Instant) -> bool {
        !self.connecting && !self.unsupported && self.connect_after.is_none_or(|t| now >= t)
    }

    /// Sends `SUBSCRIBE` for every channel not yet asked for on the line.
    fn subscribe_unsent(&mut self, now: Instant, io: Duration) {
        self.move_channels(now, io, Sender::subscribe, |channel| {
            (channel.sub == Sub::Unsent).then_some(Sub::Sent { due: now + io })
        });
    }

    /// Unsubscribes the channels nobody waited on for [`LINGER`]: the set
    /// stays as small as the resources waited on lately.
    fn retire_lingering(&mut self, now: Instant, io: Duration) {
        self.move_channels(now, io, Sender::unsubscribe, |channel| {
            let idle = now.saturating_duration_since(channel.left) >= LINGER;
            let retire = channel.waiters == 0 && channel.sub == Sub::Confirmed && idle;
            retire.then_some(Sub::Leaving)
        });
    }

    /// Moves each channel for which `next` gives a new state to it, and
    /// sends `command` for them all in one write.
    fn move_channels(
        &mut self,
        now: Instant,
        io: Duration,
        command: fn(&mut Sender, &[&str], Instant) -> Result<(), Failure>,
        next: impl Fn(&Channel) -> Option<Sub>,
    ) {
        let Some(line) = &mut self.line else {
            return;
        };
        let mut names = Vec::new();
        for (resource, channel) in &mut self.channels {
            if let Some(sub) = next(channel) {
                channel.sub = sub;
                names.push(format!("{RELEASED_CHANNEL_PREFIX}{resource}"));
            }
        }
        if names.is_empty() {
            return;
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        if command(&mut line.sender, &names, now + io).is_err() {
            self.fail_line(now);
        }
    }

    /// When the reader must be back: at the end of its pause, after at most
    /// `io` (so that subscriptions sent meanwhile are checked in time), or
    /// when the line owes an answer.
    fn read_deadline(&self, now: Instant, until: Instant, io: Duration) -> Instant {
        let mut deadline = until.min(now + io);
        if let Some(due) = self.line.as_ref().and_then(|l| l.ping_due) {
            deadline = deadline.min(due);
        }
        for channel in self.channels.values() {
            if let Sub::Sent { due } = channel.sub {
                deadline = deadline.min(due);
            }
        }
        deadline
    }

    /// What the reader of line `epoch` heard. Returns whether other threads
    /// should look (a waiter woken, the line gone).
    fn heard(
        &mut self,
        epoch: u64,
        listener: Listener,
        heard: Result<Event, Failure>,
        now: Instant,
    ) -> bool {
        if epoch != self.epoch {
            // The line failed meanwhile; this listener is of the old one.
            return true;
        }
        let Some(line) = &mut self.line else {
            return true;
        };
        line.listener = Some(listener);
        match heard {
            Ok(event) => {
                line.heard = now;
                self.on_event(event, now)
            }
            Err(Failure::TimedOut) => {
                if self.overdue(now) {
                    self.fail_line(now);
                    return true;
                }
                false
            }
            Err(_) => {
                self.fail_line(now);
                true
            }
        }
    }

    fn on_event(&mut self, event: Event, now: Instant) -> bool {
        match event {
            Event::Message { channel, payload } => {
                if let Some(at) = self.echoes.iter().position(|t| *t == payload) {
                    self.echoes.remove(at);
                    return false;
                }
                let Some(resource) = resource_of(&channel) else {
                    return false;
                };
                if payload.starts_with(CLEAN_UP_MARK) {
                    // A weaker hint: it moves no stamp (a waiter that
                    // registers after it does not wake for it), and wakes
                    // only a waiter that no clean-up woke in vain yet.
                    return self.channels.contains_key(&resource)
                        && self.wake_one(&resource, Wake::CleanedUp, |w| {
                            !w.needs_confirm && w.marker.is_none() && !w.deaf_to_clean_ups
                        });
                }
                let stamp = self.next_stamp();
                let Some(channel) = self.channels.get_mut(&resource) else {
                    return false;
                };
                channel.stamp = stamp;
                // Only waiters whose reference point has passed: what came
                // before is no news to them.
                self.wake_one(&resource, Wake::Released, |w| {
                    !w.needs_confirm && w.marker.is_none()
                })
            }
            Event::Subscribed(channel) => {
                let Some(resource) = resource_of(&channel) else {
                    return false;
                };
                let stamp = self.next_stamp();
                match self.channels.get_mut(&resource) {
                    Some(c) if matches!(c.sub, Sub::Sent { .. }) => {
                        c.sub = Sub::Confirmed;
                        c.stamp = stamp;
                    }
                    _ => return false,
                }
                self.failed_in_row = 0;
                let mut woke = false;
                for i in 0..self.waiters.len() {
                    let waiter = &self.waiters[i];
                    if waiter.needs_confirm
                        && waiter.woken.is_none()
                        && self.confirmed_stamp(&waiter.resources).is_some()
                    {
                        let waiter = &mut self.waiters[i];
                        waiter.needs_confirm = false;
                        waiter.woken = Some(Wake::Subscribed);
                        woke = true;
                    }
                }
                woke
            }
            Event::Unsubscribed(channel) => {
                if let Some(resource) = resource_of(&channel) {
                    if self
                        .channels
                        .get(&resource)
                        .is_some_and(|c| c.sub == Sub::Leaving)
                    {
                        self.channels.remove(&resource);
                    }
                }
                false
            }
            Event::Pong => {
                let stamp = self.stamp;
                let Some(line) = &mut self.line else {
                    return false;
                };
                line.pongs += 1;
                line.ping_due = (line.pongs < line.pings).then(|| now + line.io);
                if line.pong_stamps.len() == PONG_HISTORY {
                    line.pong_stamps.pop_front();
                }
                line.pong_stamps.push_back((line.pongs, stamp));
                let pongs = line.pongs;
                for waiter in &mut self.waiters {
                    if waiter.marker.is_some_and(|k| k <= pongs) {
                        waiter.marker = None;
                    }
                }
                false
            }
        }
    }

    /// The line owes an answer it should have given by now.
    fn overdue(&self, now: Instant) -> bool {
        let ping_late = self
            .line
            .as_ref()
            .and_then(|l| l.ping_due)
            .is_some_and(|due| now >= due);
        ping_late
            || self
                .channels
                .values()
                .any(|c| matches!(c.sub, Sub::Sent { due } if now >= due))
    }

    /// Drops the line and moves to the next node. Its waiters wake once
    /// the next line confirms their channels (what came in between is
    /// unknown).
    fn fail_line(&mut self, now: Instant) {
        self.line = None;
        self.epoch += 1;
        self.echoes.clear();
        self.channels.retain(|_, c| c.waiters > 0);
        for channel in self.channels.values_mut() {
            channel.sub = Sub::Unsent;
        }
        for waiter in &mut self.waiters {
            waiter.needs_confirm = true;
            waiter.marker = None;
        }
        self.next_node(now);
    }

    /// The node failed us: the next one, after a backoff once all failed.
    fn next_node(&mut self, now: Instant) {
        self.node = (self.node + 1) % self.nodes;
        self.failed_in_row += 1;
        if self.failed_in_row >= self.nodes {
            self.failed_in_row = 0;
            self.connect_after = Some(now + BACKOFF);
        }
    }
}

impl Line {
    /// Sends a `PING`; returns its number.
    fn ping(&mut self, now: Instant) -> Result<u64, Failure> {
        self.sender.ping(now + self.io)?;
        self.pings += 1;
        self.ping_due.get_or_insert(now + self.io);
        Ok(self.pings)
    }

    /// The stamp the answer to `PING` number `k` came at, if remembered.
    fn pong_stamp(&self, k: u64) -> Option<u64> {
        self.pong_stamps
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, stamp)| *stamp)
    }
}

/// The resource a channel of ours names.
fn resource_of(channel: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(channel).ok()?;
    name.strip_prefix(RELEASED_CHANNEL_PREFIX)
        .map(str::to_string)
}

/// A random duration in `[0, bound)`.
pub(crate) fn random_below(bound: Duration) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(getrandom::u64().unwrap_or(0) % nanos)
}
