//! `Redlock`, its builder, and the public operations: the only place that
//! knows the algorithm (quorum, validity, retry).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::error::{
    ArgumentError, ConfigError, LockError, NodeError, NodeOutcome, NodeReport, Report,
};
use crate::lock::{check_resources, Lock, Token};
use crate::node::{Failure, Node};
use crate::round::{self, Reply};
use crate::script::{self, Command};

pub(crate) mod fencing;

/// The largest TTL accepted: Redis rejects expiry times that overflow a
/// signed 64-bit count of milliseconds since the epoch; half of that range
/// leaves room for any clock.
pub const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The fixed part of the drift term: 2 ms for the resolution of Redis'
/// expiry and of the clocks.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// A Redlock client over N independent Redis (or Valkey) masters.
///
/// One value holds the configuration and a pool of connections to every
/// node. It is `Send + Sync` and cheap to clone (an `Arc` inside): share it
/// between threads rather than building one per thread, so that threads
/// reuse each other's idle connections.
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
}

/// The settings of a [`Redlock`], with their defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Config {
    retry_count: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    drift_factor: f64,
    io_timeout: Duration,
    connect_timeout: Duration,
    restart_grace: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            retry_count: 3,
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(100),
            drift_factor: 0.01,
            io_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(50),
            restart_grace: Duration::ZERO,
        }
    }
}

/// Builds a [`Redlock`] with settings other than the defaults.
///
/// ```no_run
/// use std::time::Duration;
/// use redlock_sync::Redlock;
///
/// let locks = Redlock::builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .retry_count(5)
///     .retry_delay(Duration::from_millis(100))
///     .retry_jitter(Duration::from_millis(100))
///     .drift_factor(0.01)
///     .io_timeout(Duration::from_millis(200))
///     .connect_timeout(Duration::from_millis(200))
///     .build()?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build()"]
pub struct RedlockBuilder {
    urls: Vec<String>,
    config: Config,
}

impl RedlockBuilder {
    /// How many times [`Redlock::acquire`] tries again after a failed round
    /// (so it runs at most `retry_count + 1` rounds). Default: 3.
    pub fn retry_count(mut self, count: u32) -> Self {
        self.config.retry_count = count;
        self
    }

    /// The fixed part of the pause between two rounds. Default: 200 ms.
    /// Zero is allowed.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.config.retry_delay = delay;
        self
    }

    /// The random part of the pause between two rounds: the pause is drawn
    /// from `[retry_delay, retry_delay + retry_jitter)`, so that contending
    /// clients spread out. Default: 100 ms. Zero is allowed.
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.config.retry_jitter = jitter;
        self
    }

    /// The share of the TTL set aside for clock drift between processes:
    /// `validity = ttl - elapsed - (ttl * drift_factor + 2 ms)`. Must be in
    /// `[0, 1)`. Default: 0.01.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// The bound on one round's network I/O: a round's deadline is this long
    /// after it begins, and a node that has not answered by then counts as
    /// failed. Keep it small next to the TTL. Default: 50 ms.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.config.io_timeout = timeout;
        self
    }

    /// The bound on opening one connection (TCP connect and, if the URL asks,
    /// `AUTH` and `SELECT`). A connect never runs past its round's deadline
    /// either. Default: 50 ms.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// The restarted-node guard: a node that has been up for less than
    /// `grace` does not vote. Default: off (zero).
    ///
    /// A node that restarts without persistence forgets its locks; if it
    /// voted at once, another client could win a quorum that includes it
    /// while the first client still holds the lock on the other nodes. With
    /// a grace period, every new connection reads the node's uptime with
    /// `INFO server` (pipelined with the handshake: no extra round trip),
    /// and while the uptime is below `grace` the node is reported as failed
    /// with [`NodeError::Restarted`] and gets no command. Once its uptime
    /// reaches `grace`, it votes again: a later round simply reconnects.
    ///
    /// Set `grace` to at least the longest TTL you pass to `acquire` or
    /// `extend` (the locks a restarted node forgot have all expired by then),
    /// plus a margin for clock rate differences. The uptime has whole-second
    /// resolution; the guard takes the least the real uptime can be (a
    /// second less than reported), so a node is kept out up to about two
    /// seconds longer than `grace`, never shorter. A node whose `INFO`
    /// command is disabled or answers without an uptime never votes while
    /// the guard is on. The check relies on a restarted server being
    /// reachable only through new connections, which holds for direct
    /// connections and plain TCP proxies; a connection pooler that keeps
    /// the client's connection while it reconnects to a restarted server
    /// behind it would hide the restart.
    ///
    /// It is off by default because the right value depends on the longest
    /// TTL, which only you know, and because a guard that is too long makes
    /// every freshly started node (a new deployment, a test cluster) refuse
    /// to vote for that long. Nodes that run with `appendonly yes` and
    /// `appendfsync always` keep their locks across restarts and do not need
    /// it. The guard does not help against data lost without a restart
    /// (`FLUSHALL`, a failover to a replica that had not caught up).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_sync::Redlock;
    ///
    /// // Locks are taken for at most 30 s (TTLs of acquire and extend).
    /// let locks = Redlock::builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
    ///     .restart_grace(Duration::from_secs(35))
    ///     .build()?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn restart_grace(mut self, grace: Duration) -> Self {
        self.config.restart_grace = grace;
        self
    }

    /// Checks the settings and the node URLs, and builds the client. No
    /// connection is opened yet: each node connects lazily in its first
    /// round.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] naming what is wrong: no nodes, a URL that does
    /// not parse or is not supported, the same server listed twice, a drift
    /// factor outside `[0, 1)`, or a zero timeout.
    pub fn build(self) -> Result<Redlock, LockError> {
        let config = self.config;
        if !(0.0..1.0).contains(&config.drift_factor) {
            return Err(ConfigError::DriftFactor {
                value: config.drift_factor,
            }
            .into());
        }
        if config.io_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout {
                which: "io_timeout",
            }
            .into());
        }
        if config.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout {
                which: "connect_timeout",
            }
            .into());
        }
        if self.urls.is_empty() {
            return Err(ConfigError::NoNodes.into());
        }
        let mut nodes = self
            .urls
            .iter()
            .map(|url| Node::parse(url))
            .collect::<Result<Vec<_>, _>>()?;
        for node in &mut nodes {
            node.guard_restarts(config.restart_grace);
        }
        let mut seen = HashSet::new();
        for node in &nodes {
            if !seen.insert(node.identity()) {
                return Err(ConfigError::DuplicateNode {
                    node: node.name().to_string(),
                }
                .into());
            }
        }
        let quorum = nodes.len() / 2 + 1;
        Ok(Redlock {
            inner: Arc::new(Inner {
                nodes,
                quorum,
                config,
            }),
        })
    }
}

/// What the nodes of one round said, counted.
struct Tally {
    report: Report,
    /// Validity left after the round, measured from its start.
    validity: Option<Duration>,
    start: Instant,
}

impl Tally {
    fn granted(&self) -> bool {
        self.report.granted() >= self.report.quorum && self.validity.is_some()
    }

    /// So many nodes refused that no quorum can have granted.
    fn refused_by_quorum_complement(&self) -> bool {
        self.report.refused() > self.report.nodes.len() - self.report.quorum
    }

    /// The error for a round that did not succeed.
    fn error(self, resource: &str, attempts: u32, ttl: Duration) -> LockError {
        let resource = resource.to_string();
        let report = self.report;
        if report.granted() >= report.quorum {
            LockError::TooSlow {
                resource,
                ttl,
                report,
            }
        } else if report.granted() + report.refused() >= report.quorum {
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
    /// A URL is `redis://[user:password@]host:port[/db]`,
    /// `redis+unix:///path/to/socket[?db=N]`, or, with the `tls` feature,
    /// `rediss://...`. Give each independent master once; a quorum is
    /// `N / 2 + 1` of them.
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
    pub fn builder<I, S>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedlockBuilder {
            urls: nodes.into_iter().map(|s| s.as_ref().to_string()).collect(),
            config: Config::default(),
        }
    }

    /// How many nodes must agree: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The nodes' addresses (`host:port` or socket path; never passwords).
    pub fn nodes(&self) -> Vec<&str> {
        self.inner.nodes.iter().map(Node::name).collect()
    }

    /// Acquires a lock on `resource` for `ttl`, retrying after a jittered
    /// pause while it is held by another client or too few nodes answer, up
    /// to the retry count.
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
        self.acquire_with(
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
        self.acquire_with(vec![resource.to_string()], ttl, 0)
    }

    fn acquire_with(
        &self,
        resources: Vec<String>,
        ttl: Duration,
        retries: u32,
    ) -> Result<Lock, LockError> {
        check_resources(&resources)?;
        let ttl_ms = self.check_ttl(ttl)?;
        let token = Token::random()?;
        let cmd = match resources.as_slice() {
            [one] => Command::acquire(one, &token, ttl_ms),
            many => Command::script(
                &script::ACQUIRE_MANY,
                many,
                &[&token.hex(), ttl_ms.to_string().as_bytes()],
            ),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let tally = self.round(&cmd, ttl, acquire_vote);
            if tally.granted() {
                return Ok(Lock {
                    valid_until: tally.start + tally.validity.unwrap_or_default(),
                    resources,
                    token,
                    report: tally.report,
                    fencing_token: None,
                });
            }
            // The SET may have landed where the reply was lost or late:
            // release everywhere before trying again or giving up.
            self.release_round(&resources, &token);
            if attempt > retries {
                return Err(tally.error(&resources[0], attempt, ttl));
            }
            std::thread::sleep(self.retry_pause()?);
        }
    }

    /// Extends `lock` to expire `ttl` from now, if a quorum of nodes still
    /// holds its token. On success, the lock's validity and report are
    /// measured anew from this round. Too few nodes answering is retried per
    /// the retry policy; a refusal by too many nodes is final.
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
    /// - [`LockError::NoQuorum`] when too few nodes answered, after retries.
    /// - [`LockError::TooSlow`] when the round used up the whole TTL.
    /// - [`LockError::Argument`] for a bad TTL.
    ///
    /// On error the lock is left as it was: its validity still counts down
    /// from the last successful round.
    pub fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), LockError> {
        let ttl_ms = self.check_ttl(ttl)?;
        let cmd = Command::script(
            &script::EXTEND,
            &lock.resources,
            &[&lock.token.hex(), ttl_ms.to_string().as_bytes()],
        );
        let mut attempt = 0;
        loop {
            attempt += 1;
            let tally = self.round(&cmd, ttl, script_vote);
            if tally.granted() {
                lock.valid_until = tally.start + tally.validity.unwrap_or_default();
                lock.report = tally.report;
                return Ok(());
            }
            if tally.refused_by_quorum_complement() {
                return Err(LockError::Lost {
                    resource: lock.resources[0].clone(),
                    report: tally.report,
                });
            }
            if attempt > self.inner.config.retry_count || tally.report.granted() >= self.quorum() {
                return Err(tally.error(&lock.resources[0], attempt, ttl));
            }
            std::thread::sleep(self.retry_pause()?);
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
        let tally = self.release_round(&lock.resources, &lock.token);
        if tally.report.granted() >= tally.report.quorum {
            Ok(tally.report)
        } else if tally.refused_by_quorum_complement() {
            Err(LockError::Lost {
                resource: lock.resources[0].clone(),
                report: tally.report,
            })
        } else {
            Err(LockError::NoQuorum {
                resource: lock.resources[0].clone(),
                attempts: 1,
                report: tally.report,
            })
        }
    }

    /// One release round over every node (no validity involved).
    fn release_round(&self, resources: &[String], token: &Token) -> Tally {
        let cmd = Command::script(&script::RELEASE, resources, &[&token.hex()]);
        let wanted = resources.len() as i64;
        self.round(&cmd, Duration::ZERO, |value| match value {
            Value::Int(n) if *n == wanted => Ok(true),
            Value::Int(_) => Ok(false),
            other => Err(other),
        })
    }

    /// Runs one round and counts the votes. `vote` reads one node's reply:
    /// `Ok(true)` granted, `Ok(false)` refused, `Err` unexpected.
    fn round(
        &self,
        cmd: &Command,
        ttl: Duration,
        vote: impl Fn(&Value) -> Result<bool, &Value>,
    ) -> Tally {
        let inner = &*self.inner;
        let start = Instant::now();
        let deadline = start + inner.config.io_timeout;
        let replies = round::run(
            &inner.nodes,
            cmd,
            start,
            deadline,
            inner.config.connect_timeout,
        );
        let elapsed = start.elapsed();
        let nodes = inner
            .nodes
            .iter()
            .zip(replies)
            .map(|(node, Reply { result, elapsed })| NodeReport {
                node: node.name().to_string(),
                outcome: outcome(result, &vote),
                elapsed,
            })
            .collect();
        let drift = self.drift(ttl);
        Tally {
            report: Report {
                nodes,
                quorum: inner.quorum,
                elapsed,
            },
            validity: ttl
                .checked_sub(elapsed)
                .and_then(|v| v.checked_sub(drift))
                .filter(|v| !v.is_zero()),
            start,
        }
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

    /// A pause drawn from `[retry_delay, retry_delay + retry_jitter)`.
    fn retry_pause(&self) -> Result<Duration, LockError> {
        let config = &self.inner.config;
        let jitter_ns = u64::try_from(config.retry_jitter.as_nanos()).unwrap_or(u64::MAX);
        let extra = if jitter_ns == 0 {
            0
        } else {
            getrandom::u64().map_err(LockError::Random)? % jitter_ns
        };
        Ok(config
            .retry_delay
            .saturating_add(Duration::from_nanos(extra)))
    }
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
        Err(Failure::TimedOut) => NodeOutcome::TimedOut,
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
