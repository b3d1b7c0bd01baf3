//! `Redlock`, the building of its nodes, and the public operations: the only place that
//! knows the algorithm (quorum, validity, retry).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use config::{Config, RedlockBuilder, MAX_TTL};

use crate::error::{
    ArgumentError, ConfigError, Failure, LockError, NodeError, NodeOutcome, NodeReport, Report,
};
use crate::lock::{Lock, Token};
use crate::node::{Endpoint, Node};
use crate::round::{self, Reply};
use crate::script::{self, Command};
use crate::wait::{random_below, Waiters, Wake};
use fencing::check_acquirable;

pub(crate) mod config;
pub(crate) mod fencing;

/// The fixed part of the drift term: 2 ms for the resolution of Redis'
/// expiry and of the clocks.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// A Redlock client over N independent Redis (or Valkey) masters.
///
/// One value holds the configuration and one connection to every node. It
/// is `Send + Sync` and cheap to clone (an `Arc` inside): share it between
/// threads rather than building one per thread, so that their commands
/// share connections and go out batched. Its `Debug` output shows the
/// nodes (never their passwords), the quorum and the settings.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_sync::Redlock;
///
/// let locks = Redlock::new([
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
///     "redis://127.0.0.1:7003",
/// ])?;
/// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
/// // ... work while lock.validity() is comfortably above zero ...
/// locks.release(lock)?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    quorum: usize,
    config: Config,
    /// The threads waiting for a release, and the line they listen on.
    waiters: Waiters,
}

/// The nodes by address (never with a password), the quorum, and every
/// setting.
impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Redlock");
        out.field("nodes", &self.nodes())
            .field("quorum", &self.inner.quorum);
        self.inner.config.debug_fields(&mut out);
        out.finish()
    }
}

impl RedlockBuilder {
    /// Checks the settings and the node URLs, and builds the client. No
    /// connection is opened yet: each node connects lazily in its first
    /// round.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming what is wrong: no nodes, a URL that does
    /// not parse or is not supported, the same server listed twice, a drift
    /// factor outside `[0, 1)`, an `extend_when_left` outside `(0, 1)`, or a
    /// timeout that is zero or above [`MAX_TIMEOUT`](crate::MAX_TIMEOUT).
    ///
    /// ```
    /// use redlock_sync::{ConfigError, LockError, Redlock};
    ///
    /// // No connection is opened: a client over unreachable nodes builds fine.
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]).build()?;
    /// assert_eq!(locks.quorum(), 2);
    /// // The same server twice is refused.
    /// let twice = Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7001/1"]).build();
    /// assert!(matches!(twice, Err(LockError::Config(ConfigError::DuplicateNode { .. }))));
    /// # Ok::<(), LockError>(())
    /// ```
    pub fn build(self) -> Result<Redlock, LockError> {
        let (urls, config) = self.checked()?;
        let endpoints = urls
            .iter()
            .map(|url| Endpoint::parse(url))
            .collect::<Result<Vec<_>, _>>()?;
        let mut seen = HashSet::new();
        for endpoint in &endpoints {
            if !seen.insert(&endpoint.identity) {
                return Err(ConfigError::DuplicateNode {
                    node: endpoint.name.to_string(),
                }
                .into());
            }
        }
        let servers = Arc::default();
        let nodes: Vec<Node> = endpoints
            .into_iter()
            .enumerate()
            .map(|(index, endpoint)| {
                Node::new(
                    endpoint,
                    index,
                    Arc::clone(&servers),
                    config.restart_grace,
                    config.reconnect_backoff(),
                )
            })
            .collect();
        let quorum = nodes.len() / 2 + 1;
        Ok(Redlock {
            inner: Arc::new(Inner {
                waiters: Waiters::new(nodes.len(), config.io_timeout, config.connect_timeout),
                nodes,
                quorum,
                config,
            }),
        })
    }
}

/// How long a round reads replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// Until a quorum granted, or can no longer grant.
    UntilDecided,
    /// Every reply, until the deadline.
    EveryReply,
}

/// What the nodes of one round said, counted.
struct Tally {
    report: Report,
    /// Validity left after the round, measured from its start.
    validity: Option<Duration>,
    start: Instant,
    /// A quorum granted, but no validity was left (for a fenced attempt:
    /// round one won, and none was left after round two, whose refusals
    /// then only say that the keys had expired).
    too_slow: bool,
}

impl Tally {
    fn granted(&self) -> bool {
        self.report.granted() >= self.report.quorum && self.validity.is_some()
    }

    /// So many nodes refused that no quorum can have granted.
    fn refused_by_quorum_complement(&self) -> bool {
        self.report.refused() > self.report.nodes.len() - self.report.quorum
    }

    /// The error for a round that did not succeed: too slow if a quorum
    /// granted but no validity was left; no quorum if the failed nodes
    /// alone rule one out; else contended (a node refused, and it was that
    /// refusal that made the difference). Judged on the nodes read, whether
    /// or not the round stopped early.
    fn error(self, resource: &str, attempts: u32, ttl: Duration) -> LockError {
        let resource = resource.to_string();
        let report = self.report;
        if self.too_slow {
            LockError::TooSlow {
                resource,
                ttl,
                report,
            }
        } else if report.failed() <= report.nodes.len() - report.quorum {
            LockError::Contended {
                resource,
                attempts,
                report,
            }
        } else {
            LockError::NoQuorum {
                resource,
                attempts,
                report,
            }
        }
    }
}

impl Redlock {
    /// A client over the given node URLs, with the default settings (see
    /// [`RedlockBuilder`]).
    ///
    /// A URL is `redis://[user:password@]host:port[/db]` (a password alone
    /// goes after a colon: `redis://:password@host:port`),
    /// `redis+unix:///path/to/socket[?db=N][&pass=P]`, or, with the `tls`
    /// feature, `rediss://...`; `valkey://`, `valkey+unix://` and
    /// `valkeys://` are the same. Give each independent master once; a
    /// quorum is `N / 2 + 1` of them.
    ///
    /// ```no_run
    /// # use redlock_sync::Redlock;
    /// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
    /// assert_eq!(locks.quorum(), 2);
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RedlockBuilder::build`].
    pub fn new<I, S>(nodes: I) -> Result<Redlock, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder(nodes).build()
    }

    /// A builder over the given node URLs, to change the defaults.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use redlock_sync::Redlock;
    /// let locks = Redlock::builder(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .retry_count(5)
    ///     .build()?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn builder<I, S>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedlockBuilder::new(nodes.into_iter().map(|s| s.as_ref().to_string()).collect())
    }

    /// How many nodes must agree: `N / 2 + 1`.
    ///
    /// ```
    /// # use redlock_sync::Redlock;
    /// let five = Redlock::new(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379", "redis://h4:6379", "redis://h5:6379"])?;
    /// assert_eq!(five.quorum(), 3);
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The nodes' addresses (`host:port`, `tls host:port`, or the socket
    /// path; never passwords).
    ///
    /// ```
    /// # use redlock_sync::Redlock;
    /// let locks = Redlock::new(["redis://:s3cret@127.0.0.1:7001/2", "redis+unix:///tmp/redis.sock"])?;
    /// assert_eq!(locks.nodes(), ["127.0.0.1:7001", "/tmp/redis.sock"]);
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn nodes(&self) -> Vec<&str> {
        self.inner.nodes.iter().map(|n| &**n.name()).collect()
    }

    /// Acquires a lock on `resource` for `ttl`, retrying after a jittered
    /// pause while it is held by another client or too few nodes answer, up
    /// to the retry count and within the wait budget
    /// ([`max_wait`](RedlockBuilder::max_wait)), whichever ends first.
    /// A pause ends early when a node says the resource was released: the
    /// attempts made then come on top of the retry count, within the pause
    /// (see the README's "Waiting for a release").
    ///
    /// The returned lock is valid for `ttl` minus the time the winning round
    /// took minus the drift term; see [`Lock::validity`].
    ///
    /// ```no_run
    /// # use redlock_sync::Redlock;
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
    /// assert!(lock.validity() > Duration::from_secs(9));
    /// locks.release(lock)?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - [`LockError::Argument`] for an empty resource or a TTL that is zero,
    ///   not longer than the drift term, or above [`MAX_TTL`].
    /// - [`LockError::Contended`] when the last round found the lock held by
    ///   another client.
    /// - [`LockError::NoQuorum`] when too few nodes answered the last round.
    /// - [`LockError::TooSlow`] when a quorum granted it but no validity was
    ///   left.
    pub fn acquire(&self, resource: &str, ttl: Duration) -> Result<Lock, LockError> {
        self.acquire_retrying(
            vec![resource.to_string()],
            ttl,
            self.inner.config.retry_count,
        )
    }

    /// Like [`acquire`](Self::acquire), but one round only: no retry.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// match locks.try_acquire("report", Duration::from_secs(30)) {
    ///     Ok(lock) => { /* do the work */ locks.release(lock)?; }
    ///     Err(LockError::Contended { .. }) => println!("someone else is on it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    pub fn try_acquire(&self, resource: &str, ttl: Duration) -> Result<Lock, LockError> {
        self.acquire_retrying(vec![resource.to_string()], ttl, 0)
    }

    /// Acquires one lock over several resources, all or nothing: on each
    /// node one script sets every key only if none of them is held, so a
    /// node grants all the resources or none. Retries as
    /// [`acquire`](Self::acquire) does. The lock is extended and released as
    /// one ([`extend`](Self::extend), [`release`](Self::release)).
    ///
    /// Two multi-resource locks that share a resource exclude each other;
    /// so do a multi-resource lock and a single-resource lock on one of its
    /// resources.
    ///
    /// ```no_run
    /// # use redlock_sync::Redlock;
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// // Move credit between two accounts: hold both, or neither.
    /// let lock = locks.acquire_many(["account:alice", "account:bob"], Duration::from_secs(10))?;
    /// assert_eq!(lock.resources(), ["account:alice", "account:bob"]);
    /// // ... debit one, credit the other ...
    /// locks.release(lock)?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), where the resource named in an error
    /// is the first one; and [`LockError::Argument`] for no resources, an
    /// empty resource name, or a resource named twice.
    pub fn acquire_many<I, S>(&self, resources: I, ttl: Duration) -> Result<Lock, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let retries = self.inner.config.retry_count;
        self.acquire_retrying(resource_list(resources), ttl, retries)
    }

    /// Like [`acquire_many`](Self::acquire_many), but one round only: no
    /// retry.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// match locks.try_acquire_many(["shelf:3", "shelf:4"], Duration::from_secs(30)) {
    ///     Ok(lock) => { /* rearrange both shelves */ locks.release(lock)?; }
    ///     Err(LockError::Contended { .. }) => println!("one of them is busy"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub fn try_acquire_many<I, S>(&self, resources: I, ttl: Duration) -> Result<Lock, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.acquire_retrying(resource_list(resources), ttl, 0)
    }

    /// Acquires a lock over `resources`, with up to `retries` retries and
    /// within the wait budget.
    pub(crate) fn acquire_retrying(
        &self,
        resources: Vec<String>,
        ttl: Duration,
        retries: u32,
    ) -> Result<Lock, LockError> {
        check_acquirable(&resources)?;
        let ttl_ms = self.check_ttl(ttl)?;
        self.acquire_loop(resources, ttl_ms, retries, |resources, token, ttl| {
            let cmd = match resources {
                [one] => Command::acquire(one, token, ttl_ms),
                many => Command::script(
                    &script::ACQUIRE_MANY,
                    many,
                    &[&token.hex(), ttl_ms.to_string().as_bytes()],
                ),
            };
            (self.round(&cmd, ttl, acquire_vote), None)
        })
    }

    /// The retry loop of every acquisition: `attempt` runs one attempt with
    /// a fresh token and returns its tally (and fencing token). After a
    /// failed attempt the lock is released wherever it may have landed; the
    /// loop stops after `retries` more attempts, or before one that would
    /// start past the wait budget.
    fn acquire_loop(
        &self,
        resources: Vec<String>,
        ttl_ms: u64,
        retries: u32,
        mut attempt: impl FnMut(&[String], &Token, Duration) -> (Tally, Option<u64>),
    ) -> Result<Lock, LockError> {
        let started = Instant::now();
        // Redis is given whole milliseconds: measure validity on the same.
        let ttl = Duration::from_millis(ttl_ms);
        // Attempts as the retry policy counts them: the first, and one at
        // the end of each pause. Attempts made at news during a pause (a
        // release heard of, the subscription coming up, and the retry soon
        // after one of those that lost) come on top, within the same pause.
        let mut attempts = 0;
        // The pause under way, if a wake-up cut it short: its end, and
        // whether the wait budget ends it.
        let mut pause: Option<(Instant, bool)> = None;
        // The last attempt followed a hint (a release heard of, the
        // subscription coming up). A release reaches the nodes at slightly
        // different times, and the node listened on may have said so (it
        // publishes where the key is absent too) before the nodes that held
        // the key deleted it; and news that came just as the subscription
        // came up, before the attempt it set off started, wakes nobody
        // after that attempt. An attempt that then lost is tried once more
        // soon, not after the rest of the pause, since the other nodes'
        // news never reaches this listener.
        let mut after_news = false;
        loop {
            // An attempt that starts once the pause is over is the retry
            // the policy counts, however it was woken.
            if pause.is_none_or(|(end, _)| Instant::now() >= end) {
                pause = None;
                attempts += 1;
            }
            // A fresh token each attempt: no attempt can be mistaken for an
            // earlier one (a key of ours still on a node, a late clean-up),
            // and a token is set at most once on a node (fencing relies on
            // it).
            let token = Token::random()?;
            let watch = self.inner.waiters.watch(&resources);
            let (tally, fencing_token) = attempt(&resources, &token, ttl);
            if tally.granted() {
                return Ok(Lock {
                    valid_until: tally.start + tally.validity.unwrap_or_default(),
                    timed: true,
                    resources,
                    token,
                    report: tally.report,
                    fencing_token,
                });
            }
            // The lock may have landed where the reply was lost, late or not
            // awaited: release there before trying again or giving up.
            self.clean_up(&resources, &token, ttl, &tally.report);
            // Wait out the pause, or less if a release is heard of first;
            // never past the wait budget, whose end only a release can cut
            // short. After a wake-up, the rest of the same pause.
            let (until, last) = match pause {
                Some(under_way) if Instant::now() < under_way.0 => under_way,
                _ => {
                    if attempts > retries {
                        return Err(tally.error(&resources[0], attempts, ttl));
                    }
                    let end = later(Instant::now(), self.retry_pause()?);
                    match self
                        .inner
                        .config
                        .max_wait
                        .map(|budget| later(started, budget))
                    {
                        Some(budget_end) if budget_end <= end => (budget_end, true),
                        _ => (end, false),
                    }
                }
            };
            let inner = &*self.inner;
            // Spread over half an io_timeout more: the waiters that one
            // subscription woke together do not all come back together.
            let soon = after_news
                .then(|| {
                    let io = inner.config.io_timeout;
                    later(Instant::now(), io + random_below(io / 2))
                })
                .filter(|&soon| soon < until);
            let wake = (inner.waiters).wait(watch, &inner.nodes, &resources, soon.unwrap_or(until));
            after_news = wake != Wake::TimedOut;
            // Woken, or back soon after news: the same pause goes on.
            pause = (wake != Wake::TimedOut || soon.is_some()).then_some((until, last));
            // The wait budget is used up: no attempt starts past it, even
            // one that news woke (which `wait` returns at once, however
            // late).
            if last && Instant::now() >= until {
                return Err(tally.error(&resources[0], attempts, ttl));
            }
        }
    }

    /// Extends `lock` to expire `ttl` from now, if a quorum of nodes still
    /// holds its token. On success, the lock's validity and report are
    /// measured anew from this round. Too few nodes answering is retried per
    /// the retry policy ([`retry_count`](RedlockBuilder::retry_count) and
    /// its pauses), but no retry starts after the lock's validity is over
    /// (unknown for a lock rebuilt with [`Lock::from_token`] that no
    /// extension timed yet) or [`max_wait`](RedlockBuilder::max_wait) is
    /// used up; a refusal by too many nodes is final.
    ///
    /// ```no_run
    /// # use redlock_sync::Redlock;
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let mut lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
    /// // ... most of the TTL later ...
    /// locks.extend(&mut lock, Duration::from_secs(10))?;
    /// assert!(lock.validity() > Duration::from_secs(9));
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - [`LockError::Lost`] when too many nodes no longer hold the token:
    ///   the lock expired (and may have been taken). Stop the protected work.
    /// - [`LockError::NoQuorum`] when too few nodes answered, after the
    ///   retries that fit in the lock's validity (and `max_wait`).
    /// - [`LockError::TooSlow`] when the round used up the whole TTL.
    /// - [`LockError::Argument`] for a bad TTL.
    ///
    /// On error the lock is left as it was: its validity still counts down
    /// from the last successful round.
    pub fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), LockError> {
        self.extend_retrying(lock, ttl, self.inner.config.retry_count)
    }

    /// [`extend`](Self::extend) with up to `retries` retries of a round that
    /// too few nodes answered.
    pub(crate) fn extend_retrying(
        &self,
        lock: &mut Lock,
        ttl: Duration,
        retries: u32,
    ) -> Result<(), LockError> {
        let ttl_ms = self.check_ttl(ttl)?;
        self.inner.waiters.close_if_idle();
        // Redis is given whole milliseconds: measure validity on the same.
        let ttl = Duration::from_millis(ttl_ms);
        let cmd = Command::script(
            &script::EXTEND,
            &lock.resources,
            &[&lock.token.hex(), ttl_ms.to_string().as_bytes()],
        );
        // No retry starts once the lock's validity is over (nor past
        // `max_wait`): a lock that could not be extended while it was valid
        // is not held any more, whatever a later round may find. A lock
        // rebuilt from its token has no validity known here.
        let started = Instant::now();
        let budget_end = (self.inner.config.max_wait).map(|budget| later(started, budget));
        let retry_until = match (lock.timed.then_some(lock.valid_until), budget_end) {
            (Some(valid), Some(budget)) => Some(valid.min(budget)),
            (valid, budget) => valid.or(budget),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let tally = self.round(&cmd, ttl, script_vote);
            if tally.granted() {
                lock.valid_until = tally.start + tally.validity.unwrap_or_default();
                lock.timed = true;
                lock.report = tally.report;
                return Ok(());
            }
            if tally.refused_by_quorum_complement() {
                return Err(LockError::Lost {
                    resource: lock.resources[0].clone(),
                    report: tally.report,
                });
            }
            let pause = if attempt > retries || tally.report.granted() >= self.quorum() {
                None
            } else {
                Some(self.retry_pause()?).filter(|&pause| {
                    retry_until.is_none_or(|until| later(Instant::now(), pause) < until)
                })
            };
            let Some(pause) = pause else {
                return Err(match tally.error(&lock.resources[0], attempt, ttl) {
                    // Not refused by enough nodes to be lost, not granted by
                    // enough to be held: too few answered to tell.
                    LockError::Contended {
                        resource,
                        attempts,
                        report,
                    } => LockError::NoQuorum {
                        resource,
                        attempts,
                        report,
                    },
                    other => other,
                });
            };
            std::thread::sleep(pause);
        }
    }

    /// Releases `lock` on every node: deletes each key that still holds its
    /// token, and nothing else. Returns what each node answered.
    ///
    /// ```no_run
    /// # use redlock_sync::Redlock;
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
    /// let report = locks.release(lock)?;
    /// assert!(report.granted() >= locks.quorum());
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// - [`LockError::Lost`] when fewer than a quorum still held the token:
    ///   the lock had expired, and another client may have held it while
    ///   you thought you did. Treat the work done under it accordingly.
    /// - [`LockError::NoQuorum`] when too few nodes answered to tell. The
    ///   keys that were not deleted expire at the end of their TTL.
    pub fn release(&self, lock: Lock) -> Result<Report, LockError> {
        self.release_token(&lock.resources, &lock.token)
    }

    /// [`release`](Self::release) of the lock over `resources` that `token`
    /// holds.
    pub(crate) fn release_token(
        &self,
        resources: &[String],
        token: &Token,
    ) -> Result<Report, LockError> {
        self.inner.waiters.close_if_idle();
        let tally = self.release_round(resources, token);
        if tally.report.granted() > 0 {
            // This client's own waiters need not hear it from a node.
            (self.inner.waiters).released(resources);
        }
        if tally.report.granted() >= tally.report.quorum {
            Ok(tally.report)
        } else if tally.refused_by_quorum_complement() {
            Err(LockError::Lost {
                resource: resources[0].clone(),
                report: tally.report,
            })
        } else {
            Err(LockError::NoQuorum {
                resource: resources[0].clone(),
                attempts: 1,
                report: tally.report,
            })
        }
    }

    /// One release round over every node (no validity involved).
    fn release_round(&self, resources: &[String], token: &Token) -> Tally {
        let cmd = Command::script(&script::RELEASE, resources, &[&token.hex()]);
        self.round(&cmd, Duration::ZERO, release_vote(resources.len()))
    }

    /// After a failed attempt: sends the release to every node that may hold
    /// our key (all but those that refused), without waiting for replies.
    /// The next attempt's command follows it on the same connections. A
    /// node it cannot reach now gets it first thing when next reached,
    /// while a key set with `ttl` could still be there.
    fn clean_up(&self, resources: &[String], token: &Token, ttl: Duration, report: &Report) {
        let inner = &*self.inner;
        // Quiet: a clean-up is no release that waiters should hear of.
        let cmd = Command::script(&script::RELEASE, resources, &[&token.hex(), script::QUIET]);
        let now = Instant::now();
        round::send_only(
            &inner.nodes,
            &cmd,
            now + inner.config.io_timeout,
            inner.config.connect_timeout,
            later(now, ttl),
            |i| report.nodes[i].outcome != NodeOutcome::Refused,
        );
    }

    /// Runs one round on every node and counts the votes. `vote` reads one
    /// node's reply: `Ok(true)` granted, `Ok(false)` refused, `Err`
    /// unexpected. The round stops waiting as soon as a quorum granted, or
    /// can no longer grant.
    fn round(
        &self,
        cmd: &Command,
        ttl: Duration,
        vote: impl Fn(&Value) -> Result<bool, &Value>,
    ) -> Tally {
        self.counted_round(cmd, ttl, vote, |_| true, Reading::UntilDecided)
    }

    /// Like [`round`](Self::round), but reads every reply (until the
    /// deadline), also once the outcome is decided.
    fn round_reading_every_reply(
        &self,
        cmd: &Command,
        ttl: Duration,
        vote: impl Fn(&Value) -> Result<bool, &Value>,
    ) -> Tally {
        self.counted_round(cmd, ttl, vote, |_| true, Reading::EveryReply)
    }

    /// Like [`round`](Self::round), but asks only the nodes whose entry in
    /// `asked` is true; the others show as not awaited, and count as not
    /// granting.
    fn round_asking_only(
        &self,
        asked: &[bool],
        cmd: &Command,
        ttl: Duration,
        vote: impl Fn(&Value) -> Result<bool, &Value>,
    ) -> Tally {
        self.counted_round(cmd, ttl, vote, |i| asked[i], Reading::UntilDecided)
    }

    /// One round on the nodes for which `ask` is true, its votes counted.
    fn counted_round(
        &self,
        cmd: &Command,
        ttl: Duration,
        vote: impl Fn(&Value) -> Result<bool, &Value>,
        ask: impl Fn(usize) -> bool,
        reading: Reading,
    ) -> Tally {
        let inner = &*self.inner;
        let (n, quorum) = (inner.nodes.len(), inner.quorum);
        let (mut yes, mut no) = (0, 0);
        let start = Instant::now();
        let deadline = start + inner.config.io_timeout;
        let replies = round::run(
            &inner.nodes,
            cmd,
            start,
            deadline,
            inner.config.connect_timeout,
            ask,
            (
                // The fewest replies that can decide: a quorum of grants,
                // or enough refusals that no quorum is left.
                match reading {
                    Reading::UntilDecided => quorum.min(n - quorum + 1),
                    Reading::EveryReply => n,
                },
                |result| {
                    match result {
                        Ok(value) if vote(value) == Ok(true) => yes += 1,
                        _ => no += 1,
                    }
                    reading == Reading::UntilDecided && (yes >= quorum || no > n - quorum)
                },
            ),
        );
        let elapsed = start.elapsed();
        let nodes = inner
            .nodes
            .iter()
            .zip(replies)
            .map(
                |(
                    node,
                    Reply {
                        result, elapsed, ..
                    },
                )| NodeReport {
                    node: Arc::clone(node.name()),
                    outcome: outcome(result, &vote),
                    elapsed,
                },
            )
            .collect();
        let validity = self.validity(ttl, elapsed);
        let granted = yes >= quorum;
        Tally {
            report: Report {
                nodes,
                quorum,
                elapsed,
            },
            validity,
            start,
            too_slow: granted && validity.is_none(),
        }
    }

    /// The validity a round that took `elapsed` leaves of `ttl`: none if
    /// `ttl - elapsed - drift` is not positive.
    fn validity(&self, ttl: Duration, elapsed: Duration) -> Option<Duration> {
        ttl.checked_sub(elapsed)
            .and_then(|v| v.checked_sub(self.drift(ttl)))
            .filter(|v| !v.is_zero())
    }

    /// `ttl * drift_factor + 2 ms`.
    fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.inner.config.drift_factor) + DRIFT_FLOOR
    }

    /// Checks a TTL and returns it in whole milliseconds (Redis' unit).
    fn check_ttl(&self, ttl: Duration) -> Result<u64, ArgumentError> {
        if ttl > MAX_TTL {
            return Err(ArgumentError::TtlTooLarge { ttl, max: MAX_TTL });
        }
        let ttl_ms = ttl.as_millis() as u64;
        if ttl_ms == 0 {
            return Err(ArgumentError::ZeroTtl);
        }
        let drift = self.drift(ttl);
        if Duration::from_millis(ttl_ms) <= drift {
            return Err(ArgumentError::TtlBelowDrift { ttl, drift });
        }
        Ok(ttl_ms)
    }

    /// The settings.
    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// A pause drawn from `[retry_delay, retry_delay + retry_jitter)`.
    pub(crate) fn retry_pause(&self) -> Result<Duration, LockError> {
        let config = &self.inner.config;
        let jitter_ns = u64::try_from(config.retry_jitter.as_nanos()).unwrap_or(u64::MAX);
        let extra = if jitter_ns == 0 {
            0
        } else {
            getrandom::u64().map_err(LockError::random)? % jitter_ns
        };
        Ok(config
            .retry_delay
            .saturating_add(Duration::from_nanos(extra)))
    }
}

/// Resource names as the owned list the operations work on.
pub(crate) fn resource_list<I, S>(resources: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    resources
        .into_iter()
        .map(|r| r.as_ref().to_string())
        .collect()
}

/// A `SET NX` (or the multi-resource script) reply as a vote.
fn acquire_vote(value: &Value) -> Result<bool, &Value> {
    match value {
        Value::Okay => Ok(true),
        Value::Int(1) => Ok(true),
        Value::Nil | Value::Int(0) => Ok(false),
        other => Err(other),
    }
}

/// A release script's reply (how many keys it deleted) as a vote: granted
/// if it deleted all `resources` keys.
fn release_vote(resources: usize) -> impl Fn(&Value) -> Result<bool, &Value> {
    let wanted = resources as i64;
    move |value| match value {
        Value::Int(n) if *n == wanted => Ok(true),
        Value::Int(_) => Ok(false),
        other => Err(other),
    }
}

/// A 1-or-0 script reply as a vote.
fn script_vote(value: &Value) -> Result<bool, &Value> {
    match value {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(other),
    }
}

fn outcome(
    result: Result<Value, Failure>,
    vote: &impl Fn(&Value) -> Result<bool, &Value>,
) -> NodeOutcome {
    match result {
        Err(Failure::TimedOut | Failure::ConnectTimedOut) => NodeOutcome::TimedOut,
        Err(Failure::NotAwaited) => NodeOutcome::NotAwaited,
        Err(Failure::Error(e)) => NodeOutcome::Failed(e),
        Ok(Value::ServerError(e)) => NodeOutcome::Failed(NodeError::Server(format!(
            "{} {}",
            e.code(),
            e.details().unwrap_or("")
        ))),
        Ok(value) => match vote(&value) {
            Ok(true) => NodeOutcome::Granted,
            Ok(false) => NodeOutcome::Refused,
            Err(other) => NodeOutcome::Failed(NodeError::Protocol(format!("{other:?}"))),
        },
    }
}

/// `t + d`, or a year after `t` where that is past the clock's range (a
/// `Duration::MAX` retry delay, wait budget or TTL).
fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(365 * 86_400))
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::testing::Cluster;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Whether no thread of `locks` is counted awake on its pace: true
    /// whenever no operation is under way.
    fn pace_idle(locks: &Redlock) -> bool {
        let pace = locks.inner.nodes[0].pace();
        pace.hold();
        pace.release()
    }

    #[test]
    fn the_pace_counts_no_thread_awake_once_rounds_that_met_noscript_are_over() {
        let cluster = Cluster::start(3).expect("3 redis-server nodes");
        let locks = Redlock::builder(cluster.urls())
            .io_timeout(Duration::from_secs(1))
            .connect_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..16 {
                let (locks, stop) = (&locks, &stop);
                s.spawn(move || {
                    let resource = format!("pace-{t}");
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(lock) = locks.try_acquire(&resource, Duration::from_secs(10)) {
                            let _ = locks.release(lock);
                        }
                    }
                });
            }
            // Every flush makes the releases in flight answer NOSCRIPT, and
            // their threads send them again as EVAL within the round.
            for _ in 0..200 {
                for node in cluster.nodes() {
                    let _ = node.query(&["SCRIPT", "FLUSH"]);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(
            pace_idle(&locks),
            "a thread is still counted awake with no round under way: \
             queued commands now wait out FLUSH_GRACE in every round"
        );
    }
}
