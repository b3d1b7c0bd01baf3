//! `LockError` and what each node answered in a round.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Everything that can go wrong building a [`Redlock`](crate::Redlock) or
/// running one of its operations.
///
/// Match on the variant to decide what to do:
///
/// | variant | what happened | what to do |
/// |---|---|---|
/// | [`Config`](Self::Config) | the configuration is invalid | fix it |
/// | [`Argument`](Self::Argument) | an argument is invalid | fix the call |
/// | [`Contended`](Self::Contended) | another client holds the lock | wait and retry, or give up |
/// | [`NoQuorum`](Self::NoQuorum) | too few nodes answered to decide | check the nodes in the report |
/// | [`TooSlow`](Self::TooSlow) | a quorum agreed, with no validity left | use a longer TTL |
/// | [`Lost`](Self::Lost) | the lock expired or was taken | assume your work may have overlapped another's |
/// | [`Unusable`](Self::Unusable) | too few nodes can serve this client at all, or the resource is held as another kind | fix the nodes named (URL, password, ACL, TLS, host), or use the kind named |
/// | [`Cancelled`](Self::Cancelled) | the call's [`Cancel`](crate::Cancel) fired | stop |
/// | [`Random`](Self::Random) | the OS random source failed | retry; check the system |
/// | [`Thread`](Self::Thread) | no thread for the watchdog | retry; check the thread limits |
/// | [`Panicked`](Self::Panicked) | the backoff panicked on the watchdog; the lock was released | fix the backoff; the work is unprotected |
///
/// Variants from talking to nodes carry a [`Report`] of the last round.
/// They are `#[non_exhaustive]`, as are [`NodeError`]'s with fields: match
/// them with `{ field, .. }`. [`ConfigError`] and [`ArgumentError`] compare
/// with `==` and can be built in tests.
///
/// Each `Display` message includes its causes, and
/// [`source`](std::error::Error::source) returns `None`. So a report that
/// walks the chain shows nothing twice. The cause is still in the variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{LockError, Redlock};
///
/// let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// match locks.try_acquire("report", Duration::from_secs(30)) {
///     Ok(lock) => { /* do the work */ locks.release(lock)?; }
///     Err(LockError::Contended { .. }) => println!("someone else is on it"),
///     Err(e @ LockError::NoQuorum { .. }) => eprintln!("nodes unreachable: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), LockError>(())
/// ```
pub enum LockError {
    /// The client's configuration is invalid (see [`ConfigError`]).
    #[error("invalid configuration: {0}")]
    Config(ConfigError),

    /// An argument of the call is invalid (see [`ArgumentError`]).
    #[error("invalid argument: {0}")]
    Argument(ArgumentError),

    /// Another client holds the lock: the last round reached enough nodes
    /// to decide, and too few granted.
    #[error("`{resource}` is held by another client after {attempts} attempt(s): {report}")]
    #[non_exhaustive]
    Contended {
        /// The resource asked for (the first one, for a multi-resource lock).
        resource: String,
        /// How many rounds were tried.
        attempts: u32,
        /// What each node answered in the last round.
        report: Report,
    },

    /// Too few nodes answered for a quorum: the others failed or timed out.
    /// Each failed node's error is in the report.
    #[error("too few nodes answered for `{resource}` after {attempts} attempt(s): {report}")]
    #[non_exhaustive]
    NoQuorum {
        /// The resource asked for (the first one, for a multi-resource lock).
        resource: String,
        /// How many rounds were tried.
        attempts: u32,
        /// What each node answered in the last round.
        report: Report,
    },

    /// A quorum granted the lock, but no validity was left
    /// (`elapsed + drift >= ttl`).
    #[error("`{resource}` was granted by a quorum, but the round used up the whole TTL of {ttl:?}: {report}")]
    #[non_exhaustive]
    TooSlow {
        /// The resource asked for (the first one, for a multi-resource lock).
        resource: String,
        /// The TTL asked for.
        ttl: Duration,
        /// What each node answered in the last round.
        report: Report,
    },

    /// The lock was lost, for the `reason` given. Another client may have
    /// held it meanwhile (see [the contract](crate::contract)). No other
    /// client's key was touched.
    #[error(
        "the lock on `{resource}` was lost: {}; last round: {report}",
        Why(reason)
    )]
    #[non_exhaustive]
    Lost {
        /// The resource of the lock (the first one, for a multi-resource lock).
        resource: String,
        /// What each node answered in the last round.
        report: Report,
        /// Why it is lost.
        reason: Loss,
    },

    /// Too few nodes are left for a quorum without those that failed for
    /// good ([`NodeError::is_permanent`]). Every wait ends at once with it,
    /// whatever its patience. Where each such node holds the resource as
    /// one other kind ([`NodeError::OtherKind`]), the message names that kind.
    #[error("{}", Unserved { resource, report })]
    #[non_exhaustive]
    Unusable {
        /// The resource asked for (the first one, for a multi-resource lock).
        resource: String,
        /// What each node answered in the last round.
        report: Report,
    },

    /// The call's [`Cancel`](crate::Cancel) fired, and it stopped waiting.
    /// A lock won meanwhile was released; a cancelled `extend` left the
    /// lock as it was.
    #[error("waiting for `{resource}` was cancelled")]
    #[non_exhaustive]
    Cancelled {
        /// The resource asked for (the first one, for a multi-resource lock).
        resource: String,
    },

    /// The OS random source failed while making a token or a retry delay.
    #[error("the operating system's random source failed: {0}")]
    Random(std::io::Error),

    /// The retry policy's [`backoff`](crate::RetryPolicy::backoff) panicked
    /// on the watchdog, after a failed extension. The guard released its
    /// lock; other guards go on. [`check`](crate::LockGuard::check),
    /// [`unlock`](crate::LockGuard::unlock) and the loss callbacks get it
    /// instead of [`Lost`](Self::Lost).
    #[error("the guard of `{resource}` released its lock: {message}")]
    #[non_exhaustive]
    Panicked {
        /// The resource of the lock (the first one, for a multi-resource lock).
        resource: String,
        /// What panicked, and the panic's message.
        message: String,
    },

    /// The OS could not start the watchdog thread of
    /// [`with_lock`](crate::Redlock::with_lock) or
    /// [`lock`](crate::Redlock::lock). The lock was released; the closure
    /// did not run.
    #[error("could not start the watchdog thread (the lock was released): {0}")]
    Thread(std::io::Error),
}

impl From<ConfigError> for LockError {
    fn from(e: ConfigError) -> LockError {
        LockError::Config(e)
    }
}

impl From<ArgumentError> for LockError {
    fn from(e: ArgumentError) -> LockError {
        LockError::Argument(e)
    }
}

/// A bad token string is an argument error, so `token.parse()?` works in a
/// function returning `LockError`.
///
/// ```
/// use redlock_sync::{ArgumentError, Kind, Lock, LockError};
///
/// fn lock_from(resource: &str, token: &str) -> Result<Lock, LockError> {
///     Lock::from_token(resource, token.parse()?, Kind::Plain)
/// }
///
/// assert!(matches!(
///     lock_from("report", "not-a-token"),
///     Err(LockError::Argument(ArgumentError::Token(_)))
/// ));
/// ```
impl From<ParseTokenError> for LockError {
    fn from(e: ParseTokenError) -> LockError {
        LockError::Argument(ArgumentError::Token(e))
    }
}

impl LockError {
    /// The report of the last round, for the variants that talked to nodes.
    ///
    /// ```
    /// # use redlock_sync::LockError;
    /// let err = LockError::from(redlock_sync::ConfigError::NoNodes);
    /// assert!(err.report().is_none());
    /// ```
    pub fn report(&self) -> Option<&Report> {
        match self {
            Self::Contended { report, .. }
            | Self::NoQuorum { report, .. }
            | Self::TooSlow { report, .. }
            | Self::Unusable { report, .. }
            | Self::Lost { report, .. } => Some(report),
            _ => None,
        }
    }
}

/// Why a lock is lost ([`LockError::Lost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Loss {
    /// Its validity ran out before a quorum renewed it. Too few nodes
    /// answered in time, or the hold cap stopped the extensions.
    #[error("its validity ran out before a quorum renewed it")]
    Expired,
    /// Another client's token held the key on this many nodes.
    #[error("another token held it on {0} node(s)")]
    Taken(usize),
    /// The key was gone, or changed, on this many nodes: a restart, a flush, eviction, or expiry.
    #[error("its key was gone from {0} node(s)")]
    Gone(usize),
}

/// An invalid client configuration, found when the client is built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
/// ```
/// use redlock_sync::{ConfigError, LockError, Redlock};
/// let none: [&str; 0] = [];
/// assert!(matches!(Redlock::new(none), Err(LockError::Config(ConfigError::NoNodes))));
/// ```
pub enum ConfigError {
    /// No node URL was given.
    #[error("no nodes: give at least one node URL (three or more for fault tolerance)")]
    NoNodes,

    /// A node URL could not be parsed or is not supported.
    ///
    /// ```
    /// use redlock_sync::{ConfigError, LockError, Redlock};
    /// let err = Redlock::new(["redis://:hunter2@10.0.0.1:99999"]).unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid configuration: node URL `redis://:***@10.0.0.1:99999` is not usable: \
    ///      the port `99999` is not a number from 1 to 65535"
    /// );
    /// ```
    #[error("node URL `{url}` is not usable: {reason}")]
    NodeUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// Why it was rejected. It names the wrong part: the scheme, port,
        /// host, database, socket path, or a password character to escape.
        reason: String,
    },

    /// The same node is listed twice; it would count twice toward the quorum.
    /// Another database (`/1`) on the same host and port is the same node.
    /// One server under two names shows on connect
    /// ([`NodeError::SameServer`]).
    #[error("node `{node}` is listed twice; one server must have one vote (list each independent master once)")]
    DuplicateNode {
        /// The node's address (host and port, or socket path).
        node: String,
    },

    /// The drift factor is not a number in `[0, 1)`.
    #[error("drift factor {value} is outside [0, 1); the default, 0.01, suits clocks that drift less than 1%")]
    DriftFactor {
        /// The value given.
        value: f64,
    },

    /// `extend_when_left` is not a fraction in `(0, 1)`.
    #[error("extend_when_left {value} is outside (0, 1): it is the share of the TTL left when with_lock extends")]
    ExtendWhenLeft {
        /// The value given.
        value: f64,
    },

    /// A timeout was zero; a zero timeout would fail every round.
    #[error("{which} must be greater than zero")]
    ZeroTimeout {
        /// Which setting: `io_timeout` or `connect_timeout`.
        which: &'static str,
    },

    /// A timeout was longer than [`MAX_TIMEOUT`](crate::MAX_TIMEOUT).
    #[error("{which} must be at most {max:?}")]
    TimeoutTooLarge {
        /// Which setting: `io_timeout` or `connect_timeout`.
        which: &'static str,
        /// The largest value accepted.
        max: Duration,
    },
}

/// An invalid argument to one operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
/// ```
/// # use std::time::Duration;
/// use redlock_sync::{ArgumentError, LockError, Redlock};
/// let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// assert!(matches!(
///     locks.try_acquire("", Duration::from_secs(1)),
///     Err(LockError::Argument(ArgumentError::EmptyResource))
/// ));
/// # Ok::<(), LockError>(())
/// ```
pub enum ArgumentError {
    /// The resource name is empty.
    #[error("the resource name is empty")]
    EmptyResource,

    /// A multi-resource call was given no resources.
    #[error("no resources given")]
    NoResources,

    /// A multi-resource call named the same resource twice.
    #[error("resource `{0}` is named twice")]
    DuplicateResource(String),

    /// The TTL is zero (or shorter than one millisecond, Redis' unit).
    #[error("the TTL is under 1 ms, Redis' unit; give at least a few milliseconds more than the drift term (ttl * drift_factor + 2 ms)")]
    ZeroTtl,

    /// The TTL is not longer than the drift term: no validity could be left.
    #[error("the TTL of {ttl:?} is not longer than the drift term of {drift:?} (ttl * drift_factor + 2 ms): give a TTL long enough for the work (seconds are usual)")]
    TtlBelowDrift {
        /// The TTL given.
        ttl: Duration,
        /// The drift term for that TTL.
        drift: Duration,
    },

    /// The TTL is larger than Redis accepts.
    #[error("the TTL of {ttl:?} is larger than the maximum of {max:?}")]
    TtlTooLarge {
        /// The TTL given.
        ttl: Duration,
        /// The largest TTL accepted.
        max: Duration,
    },

    /// A token string is not 40 lowercase hex characters.
    #[error(transparent)]
    Token(#[from] ParseTokenError),

    /// A kind that covers one resource (all but plain: `fenced`, `shared`
    /// or `semaphore`) was asked for over several: a fencing token, a set
    /// of readers or of permits belongs to one.
    #[error("a {0} lock covers one resource; take one for each, in a fixed order")]
    OneResource(&'static str),

    /// A semaphore of no permits ([`Kind::Semaphore`](crate::Kind::Semaphore)`(0)`)
    /// could never be held.
    #[error("a semaphore needs at least one permit")]
    ZeroPermits,

    /// An owner label ([`LockOptions::owner`](crate::LockOptions::owner))
    /// is empty, longer than 200 bytes, or has a control character.
    #[error("owner label {} must be 1 to 200 bytes with no control characters (say host:pid)", Label(.0))]
    Owner(String),

    /// A call's `extend_when_left` is not a fraction in `(0, 1)`.
    #[error("extend_when_left {value} is outside (0, 1): it is the share of the validity left when a guard extends")]
    ExtendWhenLeft {
        /// The value given.
        value: f64,
    },

    /// An acquisition named a resource under the prefix the crate keeps
    /// for its own keys, `redlock-sync:` (fencing counters, see
    /// [`fence_key`](crate::fence_key), writers' intents and
    /// the kinds of shared and counted locks).
    #[error("resource `{0}` starts with `redlock-sync:`, the prefix reserved for the crate's own keys; choose another name")]
    ReservedResource(String),
}

/// What one node answered in one round.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{NodeOutcome, Redlock};
/// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
/// for node in &lock.report().nodes {
///     match &node.outcome {
///         NodeOutcome::Granted => println!("{} granted in {:?}", node.node, node.elapsed),
///         NodeOutcome::Failed(e) => eprintln!("{} failed: {e}", node.node),
///         other => println!("{}: {other}", node.node),
///     }
/// }
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
pub enum NodeOutcome {
    /// The node did what was asked: it set the key, or found our token and extended or deleted it.
    Granted,
    /// The node answered no: another client holds the key (acquire), or our
    /// token was not there (extend, release).
    Refused,
    /// No answer before the round's deadline. The connection was dropped,
    /// with two exceptions. A round already late on reaching this node
    /// keeps it for other threads still waiting on it. And a connect may
    /// never have started, for want of time.
    TimedOut,
    /// The node could not be asked, or answered with an error. An I/O or
    /// connect error dropped the connection; an error reply did not.
    Failed(NodeError),
    /// The round was decided before this node's reply was read. The command
    /// was sent; its reply is read and discarded before the next one.
    NotAwaited,
}

/// Why a node failed in a round.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{NodeOutcome, Redlock};
/// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
/// for node in &lock.report().nodes {
///     if let NodeOutcome::Failed(error) = &node.outcome {
///         eprintln!("{}: {error}", node.node); // e.g. "connect: Connection refused"
///     }
/// }
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
pub enum NodeError {
    /// Connecting (or selecting the database) failed.
    #[error("connect: {0}")]
    Connect(String),
    /// The node refused this client's credentials (`WRONGPASS`, or another
    /// error reply to `AUTH`). Or it wants a password the URL lacks
    /// (`NOAUTH`). A password alone goes after a colon:
    /// `redis://:password@host:port`. `redis://secret@host` names a *user*
    /// `secret` with no password. The message is the hint; a report names
    /// the node.
    #[error("refused authentication: {hint}")]
    #[non_exhaustive]
    Auth {
        /// The node's address, never with its password.
        node: String,
        /// The server's error reply, for instance `WRONGPASS invalid
        /// username-password pair or user is disabled.`
        reply: String,
        /// What to check in the URL.
        hint: &'static str,
    },
    /// Writing or reading failed.
    #[error("i/o: {0}")]
    Io(String),
    /// The server answered with an error.
    #[error("server: {0}")]
    Server(String),
    /// The server answered something this client does not expect.
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// The node holds the resource as another kind of lock (named here):
    /// take or release it with the kind it was taken with. Permanent.
    #[error("held here as {0}; use the kind it was taken with")]
    OtherKind(String),
    /// Another version of this crate holds the resource here, in a layout
    /// of its own (named here): upgrade every client of the resource.
    /// Permanent.
    #[error("held here by another version of redlock-sync ({0}); upgrade every client of it")]
    OtherVersion(String),
    /// The restarted-node guard kept the node out. It has been up for less
    /// than the grace period
    /// ([`RedlockBuilder::restart_grace`](crate::RedlockBuilder::restart_grace)),
    /// so it may have forgotten held locks. It votes again once its uptime,
    /// and the time since this client saw it restart, reach the grace.
    #[error(
        "restarted {uptime:?} ago, less than the restart grace of {grace:?}: not voting until then"
    )]
    #[non_exhaustive]
    Restarted {
        /// The node's reported uptime, in whole seconds (the real one may be
        /// up to a second less). Where this client saw the restart, the time
        /// since then.
        uptime: Duration,
        /// The grace period configured.
        grace: Duration,
    },

    /// This node reached the same server (the same `run_id`) as another
    /// node, under another name. One server has one vote, so this one does
    /// not vote. List each server once.
    #[error("the same server as node `{other}` (one run_id under two names): it does not vote twice; list each server once")]
    #[non_exhaustive]
    SameServer {
        /// The node that reached the server first.
        other: String,
    },
}

/// One node's answer in a round, and how long after the round began it came.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{NodeOutcome, Redlock};
/// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
/// let slowest = lock.report().nodes.iter().max_by_key(|n| n.elapsed);
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
pub struct NodeReport {
    /// The node's address, never with its password: `host:port`,
    /// `tls host:port` for a `rediss://` node, or the socket path.
    pub node: Arc<str>,
    /// What it answered.
    pub outcome: NodeOutcome,
    /// Time from the start of the round to the answer (or the failure).
    pub elapsed: Duration,
    /// The node granted an extension by setting our token again where the
    /// key was gone: a re-take (see [`Redlock::extend`](crate::Redlock::extend)).
    /// False in every other round.
    pub retook: bool,
}

/// What every node answered in one round of an operation, success or not
/// ([`Lock::report`](crate::Lock::report)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{NodeOutcome, Redlock};
/// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
/// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
/// let report = lock.report();
/// println!("{} of {} granted (quorum {}) in {:?}", report.granted(), report.nodes.len(), report.quorum, report.elapsed);
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
pub struct Report {
    /// One entry a node, in the order the nodes were configured.
    pub nodes: Vec<NodeReport>,
    /// How many nodes make a quorum.
    pub quorum: usize,
    /// How long the round took.
    pub elapsed: Duration,
    /// What a node that agreed did: granted, renewed, deleted.
    pub(crate) verb: &'static str,
}

impl NodeError {
    /// Whether waiting cannot fix this error. The node refused the
    /// credentials ([`Auth`](Self::Auth)), or lacks an ACL permission
    /// (`NOPERM`). Or TLS failed (a certificate refused, no crypto
    /// provider), or the host name does not exist. Such a node fails until
    /// its configuration is fixed.
    ///
    /// ```
    /// use redlock_sync::NodeError;
    /// assert!(NodeError::Server("NOPERM no permissions to run the 'evalsha' command".into()).is_permanent());
    /// assert!(NodeError::Io("invalid peer certificate: UnknownIssuer".into()).is_permanent());
    /// assert!(!NodeError::Io("Connection reset by peer".into()).is_permanent());
    /// ```
    pub fn is_permanent(&self) -> bool {
        // A refused certificate or no crypto provider, which TLS reports
        // as I/O errors; not a handshake cut short, as a restart can do.
        let tls = |text: &str| text.contains("certificate") || text.contains("crypto provider");
        match self {
            NodeError::Auth { .. } | NodeError::OtherKind(_) | NodeError::OtherVersion(_) => true,
            NodeError::Server(text) => text.starts_with("NOPERM"),
            NodeError::Io(text) => tls(text),
            NodeError::Connect(text) => {
                tls(text)
                    || text.starts_with("NOPERM")
                    // A lookup the resolver may answer later says so (EAI_AGAIN).
                    || (text.starts_with("could not resolve") && !text.contains("Temporary failure"))
            }
            _ => false,
        }
    }
}

impl Report {
    /// The nodes that failed with an error that waiting cannot fix (see
    /// [`NodeError::is_permanent`]).
    pub fn unusable(&self) -> impl Iterator<Item = &NodeReport> {
        (self.nodes.iter())
            .filter(|n| matches!(&n.outcome, NodeOutcome::Failed(e) if e.is_permanent()))
    }

    /// How many nodes answered [`NodeOutcome::Granted`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use redlock_sync::{NodeOutcome, Redlock};
    /// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
    /// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
    /// let report = lock.report();
    /// assert!(report.granted() >= report.quorum);
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn granted(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Granted))
    }

    /// How many nodes answered [`NodeOutcome::Refused`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use redlock_sync::{NodeOutcome, Redlock};
    /// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
    /// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
    /// let report = lock.report();
    /// assert_eq!(report.refused(), 0);
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn refused(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::Refused))
    }

    /// How many nodes failed or timed out.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use redlock_sync::{NodeOutcome, Redlock};
    /// let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
    /// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
    /// let report = lock.report();
    /// println!("{} nodes failed or timed out", report.failed());
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, NodeOutcome::TimedOut | NodeOutcome::Failed(_)))
    }

    fn count(&self, pred: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.nodes.iter().filter(|n| pred(&n.outcome)).count()
    }
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Granted => f.write_str("granted"),
            Self::Refused => f.write_str("refused"),
            Self::TimedOut => f.write_str("timed out"),
            Self::Failed(err) => write!(f, "failed ({err})"),
            Self::NotAwaited => f.write_str("not awaited (the round was decided without it)"),
        }
    }
}

/// The counts, then each failure with its nodes:
/// `1 granted, 1 refused, 1 not awaited (quorum 3 of 5) in 1.2ms; h:4, h:5:
/// timed out`. A count of zero is left out, but for the nodes that agreed.
/// The alternate form (`{:#}`) leaves out the failures.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = Some(self.verb)
            .filter(|v| !v.is_empty())
            .unwrap_or("agreed");
        write!(f, "{} {verb}", self.granted())?;
        let retook = self.nodes.iter().filter(|n| n.retook).count();
        match (self.refused(), retook) {
            (0, _) => {}
            (refused, 0) => write!(f, ", {refused} refused")?,
            (refused, retook) => write!(f, ", {refused} refused ({retook} re-took)")?,
        }
        let not_awaited = self.count(|o| matches!(o, NodeOutcome::NotAwaited));
        if not_awaited > 0 {
            write!(f, ", {not_awaited} not awaited")?;
        }
        let all = self.nodes.len();
        write!(
            f,
            " (quorum {} of {all}) in {:.1?}",
            self.quorum, self.elapsed
        )?;
        let failed: Vec<_> = self.nodes.iter().filter(|n| reason(n).is_some()).collect();
        if f.alternate() || failed.is_empty() {
            return Ok(());
        }
        write!(f, "; {}", Failed(failed))
    }
}

/// Why a lock is lost, where its report follows: the nodes it was gone
/// from are the report's refusals, so their count is not said twice.
struct Why<'a>(&'a Loss);

impl fmt::Display for Why<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Loss::Gone(_) => f.write_str("its key was gone"),
            other => other.fmt(f),
        }
    }
}

/// [`LockError::Unusable`]'s message. Where every node kept out holds the
/// resource as one other kind, it says that kind; else each failure.
struct Unserved<'a> {
    resource: &'a str,
    report: &'a Report,
}

impl fmt::Display for Unserved<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resource = self.resource;
        let unusable: Vec<&NodeReport> = self.report.unusable().collect();
        let mut kinds = unusable.iter().map(|n| other_kind(n));
        match kinds.next().flatten() {
            Some(held) if kinds.all(|k| k == Some(held)) => write!(
                f,
                "`{resource}` is held as {held}: use the kind it was taken with"
            ),
            _ => write!(
                f,
                "too few nodes can serve `{resource}`: {}",
                Failed(unusable)
            ),
        }
    }
}

/// The kind a node holds the resource as, where it said so.
fn other_kind(node: &NodeReport) -> Option<&str> {
    match &node.outcome {
        NodeOutcome::Failed(NodeError::OtherKind(kind)) => Some(kind),
        _ => None,
    }
}

/// An owner label as a message quotes it: whole up to 40 characters, else
/// its first 24 and its length, so that a long one does not fill the line.
struct Label<'a>(&'a str);

impl fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = self.0;
        match label.char_indices().nth(24) {
            Some((end, _)) if label.chars().count() > 40 => {
                let cut = format!("{}…", &label[..end]);
                write!(f, "{cut:?} ({} bytes)", label.len())
            }
            _ => write!(f, "{label:?}"),
        }
    }
}

/// Nodes that failed, each failure once: `h:1, h:2: timed out; h:3: ...`.
struct Failed<'a>(Vec<&'a NodeReport>);

impl fmt::Display for Failed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reasons: Vec<String> = self.0.iter().filter_map(|n| reason(n)).collect();
        let mut sep = "";
        for (i, why) in reasons.iter().enumerate() {
            if !reasons[..i].contains(why) {
                let had = (self.0.iter()).filter(|n| reason(n).as_ref() == Some(why));
                let nodes: Vec<&str> = had.map(|n| &*n.node).collect();
                write!(f, "{sep}{}: {why}", nodes.join(", "))?;
                sep = "; ";
            }
        }
        Ok(())
    }
}

fn reason(node: &NodeReport) -> Option<String> {
    match &node.outcome {
        NodeOutcome::TimedOut => Some("timed out".to_string()),
        NodeOutcome::Failed(e) => Some(e.to_string()),
        _ => None,
    }
}

/// A string that is not a token: a token is exactly 40 lowercase hex characters (`0-9`, `a-f`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a token is 40 lowercase hex characters (0-9, a-f): {problem}")]
/// ```
/// use redlock_sync::Token;
/// let err = "ABC".parse::<Token>().unwrap_err();
/// assert!(err.to_string().contains("40 lowercase hex"));
/// ```
pub struct ParseTokenError {
    pub(crate) problem: String,
}

/// An error reply as the server wrote it: its code, then its details.
pub(crate) fn server_error_text(e: &redis::ServerError) -> String {
    match e.details() {
        Some(details) => format!("{} {details}", e.code()),
        None => e.code().to_string(),
    }
}

/// Why an exchange with a node produced no reply. A round turns it into a [`NodeOutcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The round's deadline passed first.
    TimedOut,
    /// The round was decided without this node's reply (or it was not asked).
    NotAwaited,
    /// A connect or its handshake timed out: as `TimedOut`, and the node
    /// backs off reconnecting. Never leaves the node.
    ConnectTimedOut,
    /// Anything else.
    Error(NodeError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of one node a given outcome, as a round of `verb` makes it.
    fn report(outcomes: Vec<NodeOutcome>, quorum: usize, verb: &'static str) -> Report {
        let nodes = outcomes
            .into_iter()
            .enumerate()
            .map(|(i, outcome)| NodeReport {
                node: format!("h:{i}").into(),
                outcome,
                elapsed: Duration::from_millis(1),
                retook: false,
            });
        Report {
            nodes: nodes.collect(),
            quorum,
            elapsed: Duration::from_millis(2),
            verb,
        }
    }

    #[test]
    fn nodes_not_awaited_are_counted_apart_from_those_that_granted() {
        let mut outcomes = vec![NodeOutcome::Granted; 3];
        outcomes.extend([NodeOutcome::NotAwaited, NodeOutcome::NotAwaited]);
        let text = report(outcomes, 3, "granted").to_string();
        assert_eq!(text, "3 granted, 2 not awaited (quorum 3 of 5) in 2.0ms");
    }

    #[test]
    fn a_report_counts_refusals_and_names_each_failure_once_with_its_nodes() {
        let outcomes = vec![
            NodeOutcome::Refused,
            NodeOutcome::TimedOut,
            NodeOutcome::TimedOut,
        ];
        let report = report(outcomes, 2, "deleted");
        assert_eq!(
            report.to_string(),
            "0 deleted, 1 refused (quorum 2 of 3) in 2.0ms; h:1, h:2: timed out"
        );
        assert_eq!(
            format!("{report:#}"),
            "0 deleted, 1 refused (quorum 2 of 3) in 2.0ms"
        );
    }

    #[test]
    fn a_lost_lock_whose_key_was_gone_leaves_the_count_to_the_report() {
        let lost = LockError::Lost {
            resource: "r".into(),
            report: report(vec![NodeOutcome::Refused; 3], 2, "renewed"),
            reason: Loss::Gone(3),
        };
        assert_eq!(
            lost.to_string(),
            "the lock on `r` was lost: its key was gone; last round: 0 renewed, 3 refused \
             (quorum 2 of 3) in 2.0ms"
        );
    }

    #[test]
    fn a_resource_held_as_another_kind_is_said_so_and_other_failures_are_listed() {
        let other = || NodeOutcome::Failed(NodeError::OtherKind("a shared lock".into()));
        let unusable = LockError::Unusable {
            resource: "r".into(),
            report: report(vec![other(), other(), NodeOutcome::Granted], 2, ""),
        };
        assert_eq!(
            unusable.to_string(),
            "`r` is held as a shared lock: use the kind it was taken with"
        );
        let auth = NodeOutcome::Failed(NodeError::Auth {
            node: "h:1".into(),
            reply: "WRONGPASS".into(),
            hint: "check the password",
        });
        let unusable = LockError::Unusable {
            resource: "r".into(),
            report: report(vec![other(), auth, NodeOutcome::Granted], 2, ""),
        };
        assert_eq!(
            unusable.to_string(),
            "too few nodes can serve `r`: h:0: held here as a shared lock; use the kind it was \
             taken with; h:1: refused authentication: check the password"
        );
    }

    #[test]
    fn a_long_owner_label_is_cut_on_a_character_boundary_and_a_short_one_kept_whole() {
        let long = ArgumentError::Owner("é".repeat(150)).to_string();
        let cut = format!("owner label \"{}…\" (300 bytes) must", "é".repeat(24));
        assert!(long.starts_with(&cut), "{long}");
        let short = ArgumentError::Owner("x".repeat(40)).to_string();
        assert!(
            short.contains(&format!("\"{}\"", "x".repeat(40))),
            "{short}"
        );
    }
}
