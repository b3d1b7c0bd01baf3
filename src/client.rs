//! [`Redlock`] and its operations: the only code that knows the algorithm
//! (quorum, validity, retry).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use config::{Call, Config, RedlockBuilder, MAX_TTL};
use observe::NodesSeen;
use watchdog::Watchdog;

use crate::error::{
    server_error_text, ArgumentError, ConfigError, Failure, LockError, Loss, NodeError,
    NodeOutcome, NodeReport, Report,
};
use crate::event::What;
use crate::kind::{Kind, Release};
use crate::lock::{IntoResources, Lock};
use crate::node::{Bounds, Endpoint, Node};
use crate::request::{LockOptions, Patience};
use crate::retry::{Pause, Retries};
use crate::round;
use crate::store::reply::{Reading, Vote, CONFIRMED, DELETED, RENEWED};
use crate::store::script::{self, Command};
use crate::time::{later, Ttl};
use crate::token::Token;
use crate::wait::Waiters;
use observe::Failures;

pub(crate) mod config;
mod fencing;
pub(crate) mod guard;
pub(crate) mod inspect;
mod observe;
mod watchdog;

/// The fixed part of the drift term: the resolution of Redis' expiry and
/// of the clocks.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// A Redlock client over N independent Redis or Valkey masters.
///
/// It holds the settings and one connection to each node. It is
/// `Send + Sync` and cheap to clone. Share one between threads: their
/// commands then share connections and go out batched. `Debug` shows no
/// password.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Node>,
    config: Config,
    /// The threads waiting for a release, and the line they listen on.
    waiters: Arc<Waiters>,
    watchdog: Arc<Watchdog>,
    /// What the observer was told of each node.
    seen: NodesSeen,
}

/// The last handle is gone: so is the watchdog.
impl Drop for Inner {
    fn drop(&mut self) {
        self.watchdog.close();
    }
}

/// The nodes (never a password), the quorum and the settings.
impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (f.debug_struct("Redlock"))
            .field("nodes", &self.nodes())
            .field("quorum", &self.quorum())
            .field("settings", &self.inner.config)
            .finish()
    }
}

impl RedlockBuilder {
    /// Checks the settings and the node URLs, and builds the client. Each
    /// node connects in its first round.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for no nodes, a bad URL, the same server twice,
    /// or a setting out of range.
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
        let endpoints: Vec<Endpoint> = (urls.iter())
            .map(|url| Endpoint::parse(url))
            .collect::<Result<_, _>>()?;
        let mut seen = HashSet::new();
        if let Some(twice) = endpoints.iter().find(|e| !seen.insert(&e.identity)) {
            let node = twice.name.to_string();
            return Err(ConfigError::DuplicateNode { node }.into());
        }
        let servers = Arc::default();
        let (grace, backoff) = (config.restart_grace, config.reconnect_backoff());
        let nodes: Vec<Node> = (endpoints.into_iter().enumerate())
            .map(|(i, endpoint)| Node::new(endpoint, i, Arc::clone(&servers), grace, backoff))
            .collect();
        let waiters = Waiters::new(nodes.len(), config.io_timeout, config.connect_timeout);
        Ok(Redlock {
            inner: Arc::new(Inner {
                waiters: Arc::new(waiters),
                nodes,
                config,
                watchdog: Arc::default(),
                seen: NodesSeen::default(),
            }),
        })
    }
}

/// Which nodes a round asks, and how long it reads their replies.
pub(crate) enum Ask<'a> {
    /// Every node, until a quorum granted, or can no longer grant.
    UntilDecided,
    /// Every node, until a quorum granted; a round that is not granted
    /// reads every reply, so that its clean-up goes only where it was
    /// admitted, or no reply came.
    UntilGranted,
    /// Every node, every reply, until the deadline.
    EveryReply,
    /// Only the nodes whose entry is true (the others show as not awaited,
    /// and count as not granting), until decided.
    Only(&'a [bool]),
}

/// What a round did, for the error it ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Extend,
}

/// What the nodes of one round said, counted.
pub(crate) struct Tally {
    pub(crate) report: Report,
    /// Validity left after the round, measured from its start.
    pub(crate) validity: Option<Duration>,
    pub(crate) start: Instant,
    /// A quorum granted, but no validity was left.
    pub(crate) too_slow: bool,
    /// The largest fencing counter among the nodes that granted.
    pub(crate) fence: u64,
    /// The nodes where an extension found another token.
    pub(crate) taken: usize,
}

impl Tally {
    pub(crate) fn granted(&self) -> bool {
        self.report.granted() >= self.report.quorum && self.validity.is_some()
    }

    /// The lock a granted acquisition holds, valid from the round's start.
    fn into_lock(
        self,
        kind: Kind,
        resources: Vec<String>,
        token: Token,
        owner: Option<&str>,
    ) -> Lock {
        Lock {
            valid_until: Some(self.start + self.validity.unwrap_or_default()),
            kind,
            resources,
            token,
            fencing_token: kind.confirms().then_some(self.fence),
            report: self.report,
            owner: owner.map(str::to_string),
        }
    }

    /// So many nodes refused that no quorum can have granted.
    fn refused_by_quorum_complement(&self) -> bool {
        self.report.refused() > self.report.nodes.len() - self.report.quorum
    }

    /// The error for a round that did not succeed, judged on the nodes read.
    /// An extension that is neither lost nor held gets `NoQuorum`: too few
    /// answered to tell.
    pub(crate) fn error(self, resource: &str, attempts: u32, ttl: Ttl, op: Op) -> LockError {
        let (resource, report) = (resource.to_string(), self.report);
        let spare = report.nodes.len() - report.quorum;
        if report.unusable().count() > spare {
            LockError::Unusable { resource, report }
        } else if self.too_slow {
            LockError::TooSlow {
                resource,
                ttl: ttl.duration(),
                report,
            }
        } else if report.failed() <= spare && op == Op::Acquire {
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
    /// A client over the given node URLs, with the default settings.
    ///
    /// The URL forms are in [the crate docs](crate#node-urls). Give each
    /// independent master once.
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
        RedlockBuilder::new(nodes.into_iter().map(|s| s.as_ref().to_string()).collect())
    }

    /// How many nodes must agree: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        Kind::Plain.quorum(self.inner.nodes.len())
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

    /// Acquires a lock on `resources` for the options' TTL, waiting while
    /// another client holds it or too few nodes answer.
    ///
    /// The wait lasts as the options' [`Patience`] allows.
    /// By default, that is the client's retry policy within its
    /// [`max_wait`](RedlockBuilder::max_wait). A release heard of ends a
    /// pause early ([Waiting for a release](crate::Patience#waiting-for-a-release)).
    /// Several resources make one lock, held all or nothing: two locks that
    /// share a resource exclude each other. The lock's validity is the TTL
    /// less the round's time and the drift term ([`Lock::validity`]).
    ///
    /// ```no_run
    /// # use redlock_sync::Redlock;
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
    /// // ... work while lock.validity() is well above zero ...
    /// locks.release(lock)?;
    /// // Move credit between two accounts: hold both, or neither.
    /// let both = locks.acquire(["account:alice", "account:bob"], Duration::from_secs(10))?;
    /// locks.release(both)?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The resource an error names is the first one.
    ///
    /// - [`LockError::Argument`] for bad resources or a bad TTL (see
    ///   [`ArgumentError`]).
    /// - [`LockError::Contended`] when the last round found the lock held.
    /// - [`LockError::NoQuorum`] when too few nodes answered the last round.
    /// - [`LockError::TooSlow`] when a quorum granted but no validity was
    ///   left.
    /// - [`LockError::Unusable`] at once when errors that waiting cannot fix
    ///   leave too few nodes for a quorum.
    /// - [`LockError::Cancelled`] when the options' [`Cancel`](crate::Cancel)
    ///   fired. A lock won meanwhile is released.
    pub fn acquire(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
    ) -> Result<Lock, LockError> {
        self.acquire_with(resources.into_resources(), &options.into())
            .map(|(lock, _)| lock)
    }

    /// Like [`acquire`](Self::acquire), but one attempt only, whatever the
    /// patience: one round, or two for a fenced lock.
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
    pub fn try_acquire(
        &self,
        resources: impl IntoResources,
        options: impl Into<LockOptions>,
    ) -> Result<Lock, LockError> {
        let once = options.into().patience(Patience::Retries(0));
        self.acquire_with(resources.into_resources(), &once)
            .map(|(lock, _)| lock)
    }

    /// Every acquisition: checks the call, then waits per its options.
    /// Returns the lock and the resolved call.
    pub(crate) fn acquire_with(
        &self,
        resources: Vec<String>,
        options: &LockOptions,
    ) -> Result<(Lock, Call), LockError> {
        let kind = options.kind;
        kind.check_acquirable(&resources)?;
        let bad = |o: &&String| o.is_empty() || o.len() > 200 || o.chars().any(char::is_control);
        if let Some(owner) = options.owner.as_ref().filter(bad) {
            return Err(ArgumentError::Owner(owner.clone()).into());
        }
        let ttl = self.check_ttl(options.ttl)?;
        let call = self.inner.config.call(options, Instant::now())?;
        let owner = options.owner.as_deref();
        Ok((self.acquire_loop(kind, resources, owner, ttl, &call)?, call))
    }

    /// The retry loop of every acquisition. Its phases: attempt, clean up,
    /// plan the pause, wait (for the pause or news of a release), decide.
    fn acquire_loop(
        &self,
        kind: Kind,
        resources: Vec<String>,
        owner: Option<&str>,
        ttl: Ttl,
        call: &Call,
    ) -> Result<Lock, LockError> {
        let inner = &*self.inner;
        let waiters = Arc::clone(&inner.waiters);
        let _wakes_waiters =
            (call.cancel.as_ref()).map(|c| c.on_cancel(Arc::new(move || waiters.nudge())));
        // Attempts as the retry policy counts them, the pause as news cuts
        // it short, and the failed rounds as the observer hears of them.
        let (mut attempts, mut pause, mut failures) = (0u32, Pause::default(), Failures::default());
        // The acquisition's id: its events carry it, and a writer names its
        // intents by it from its second attempt on. Drawn only when needed.
        let mut id = Acquisition::new(inner.config.observer.is_some())?;
        let mut failed_in_a_row = 0u32;
        if call.cancelled() {
            return Err(cancelled(&resources));
        }
        loop {
            // Attempt, with a fresh token: no attempt can be mistaken for an
            // earlier one, and fencing needs a token set by one acquisition.
            attempts = attempts.saturating_add(pause.counts_next_attempt().into());
            let token = Token::random()?;
            id.next_attempt()?;
            let acquisition = id.id();
            let intent = id.intent();
            let listening = inner.waiters.listen(&resources);
            let value = crate::lock::value(&token, owner);
            let tally = self.attempt(kind, &resources, &value, ttl, intent);
            if tally.granted() {
                self.withdraw(kind, &resources, intent, ttl);
                let (report, counts) = (Ok(&tally.report), (attempts, failures.end()));
                let told = Some(What::Acquired);
                let ids = (&resources[..], &token);
                self.observe_acquiring(told, ids, acquisition, counts, report);
                let lock = tally.into_lock(kind, resources, token, owner);
                return self.unless_cancelled(lock, ttl, call);
            }
            // Clean up: the key may have landed where no reply was read.
            self.clean_up(kind, &resources, &token, ttl, &tally.report);
            let error = tally.error(&resources[0], attempts, ttl, Op::Acquire);
            let new = failures.failed(&error);
            let (ids, counts) = ((&resources[..], &token), (attempts, failures.count));
            let observe = |what: Option<What>, outcome: Result<&Report, &LockError>| {
                self.observe_acquiring(what, ids, acquisition, counts, outcome);
            };
            let budget = call.budget(&error, attempts, &mut failed_in_a_row);
            let config = &inner.config;
            let planned = match error {
                LockError::Unusable { .. } => None,
                _ if call.cancelled() => None,
                _ => pause.plan(&config.retry, budget, call.deadline, config.io_timeout),
            };
            if let Some(wake_at) = planned {
                let told = match error {
                    LockError::Contended { .. } => What::Contended,
                    _ => What::AttemptFailed,
                };
                observe(new.then_some(told), Err(&error));
                let cancelled = || call.cancelled();
                let wake =
                    (inner.waiters).wait(listening, &inner.nodes, &resources, wake_at, &cancelled);
                if pause.woken(wake) && !call.cancelled() {
                    continue;
                }
            }
            // Gave up: the error (`Cancelled` if the call was), told.
            let error = match call.cancelled() {
                true => cancelled(&resources),
                false => error,
            };
            self.withdraw(kind, &resources, intent, ttl);
            observe(Some(What::GaveUp), Err(&error));
            return Err(error);
        }
    }

    /// Extends `lock` to expire the options' TTL from now. A quorum of nodes
    /// must still hold its key as its acquisition left it.
    ///
    /// On success, the lock's validity and report are measured anew. Too few
    /// nodes answering is retried as the options' patience allows, but never
    /// after the lock's validity ends. A refusal by too many nodes is final.
    /// The round waits for every node's reply, up to `io_timeout`.
    ///
    /// An extension reads three of its [`LockOptions`]:
    ///
    /// - the TTL, which the keys get anew;
    /// - the [`Patience`]: unset, the client's retry policy within its
    ///   `max_wait`. `Patience::Retries(0)` makes one round;
    /// - the [`Cancel`](crate::Cancel), which ends the retries.
    ///
    /// It ignores the others: the kind (the lock's own is used), the owner
    /// label (the acquisition's stays), `max_hold` and `extend_when_left`
    /// (a guard's).
    ///
    /// A node that lost the key gets it set again while the validity lasts:
    /// a *re-take* ([`NodeReport::retook`]). So a guard's lock outlives a
    /// rolling restart of every node. A re-take never counts as a vote (see
    /// [the contract](crate::contract)).
    ///
    /// A loop that extends on its own schedule makes one round a call. Then
    /// a node outage costs a call one `io_timeout`, not the retry policy's
    /// pauses:
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, LockOptions, Patience, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let ttl = Duration::from_secs(10);
    /// let mut lock = locks.acquire("invoice:42", ttl)?;
    /// let once = LockOptions::new(ttl).patience(Patience::Retries(0));
    /// for _step in 0..100 {
    ///     // ... a step of the work, well within the validity ...
    ///     match locks.extend(&mut lock, &once) {
    ///         Ok(()) => {}
    ///         // Too few nodes answered: try again after the next step.
    ///         Err(LockError::NoQuorum { .. }) if lock.validity() > ttl / 2 => {}
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// locks.release(lock)?;
    /// # Ok::<(), LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// On error, the lock is left as it was.
    ///
    /// - [`LockError::Lost`] when too few nodes still hold the key to make a
    ///   quorum, or the validity ran out first. Another client may have held
    ///   the lock: stop the protected work.
    /// - [`LockError::NoQuorum`] when too few nodes answered, after the
    ///   retries that fit.
    /// - [`LockError::TooSlow`] when the round used up the whole TTL.
    /// - [`LockError::Unusable`] and [`LockError::Cancelled`] as for
    ///   [`acquire`](Self::acquire).
    /// - [`LockError::Argument`] for a bad TTL, or an `extend_when_left`
    ///   outside `(0, 1)`.
    ///
    /// [`NodeReport::retook`]: crate::NodeReport::retook
    pub fn extend(
        &self,
        lock: &mut Lock,
        options: impl Into<LockOptions>,
    ) -> Result<(), LockError> {
        let options = options.into();
        let call = self.inner.config.call(&options, Instant::now())?;
        let ttl = self.check_ttl(options.ttl)?;
        // No retry past the validity (a lock not extended while valid is not
        // held) or the call's deadline. A rebuilt lock has no validity here.
        let retry_until = lock.valid_until.into_iter().chain(call.deadline).min();
        let (mut attempt, mut failures) = (0, Failures::default());
        loop {
            if call.cancelled() {
                return Err(cancelled(&lock.resources));
            }
            attempt += 1;
            // A batch of one: one result.
            let result = (self.extend_all(&mut [(&mut *lock, ttl)], attempt)).pop();
            let result = result.unwrap_or(Ok(()));
            // Only too few nodes answering is worth another round.
            let (policy, retries) = (&self.inner.config.retry, Retries::Counted(call.retries));
            let end = matches!(result, Err(LockError::NoQuorum { .. }))
                .then(|| policy.next_extension(attempt, retries, retry_until))
                .flatten();
            // Told once a run of failures starts, and when the call ends.
            let what = match &result {
                Ok(()) => Some(What::Extended),
                Err(e) => (failures.failed(e) || end.is_none()).then_some(What::ExtendFailed),
            };
            let outcome = result.as_ref().map(|()| &lock.report);
            let counts = (attempt, failures.count);
            self.observe_counted(what, (&lock.resources, &lock.token), counts, outcome);
            match end {
                Some(end) => call.sleep_until(end),
                None => return result,
            }
        }
    }

    /// Extension rounds for all of `locks`, each by its checked TTL: one
    /// [`script::EXTEND`] call a node, then one [`script::SHARED`] call for
    /// the shared and counted ones. Each lock is judged on its own part of
    /// the replies, as if the round were its alone. Returns one outcome a
    /// lock, in order. The rules are in `docs/contract.md`.
    pub(crate) fn extend_all(
        &self,
        locks: &mut [(&mut Lock, Ttl)],
        attempt: u32,
    ) -> Vec<Result<(), LockError>> {
        if locks.is_empty() {
            return Vec::new();
        }
        self.inner.waiters.close_if_idle();
        // The round's re-take mark: 64 random bits, as 16 hex digits.
        let mark = match getrandom::u64() {
            Ok(mark) => format!("{mark:016x}"),
            Err(e) => {
                return locks
                    .iter()
                    .map(|_| Err(LockError::Random(e.into())))
                    .collect()
            }
        };
        // Shared and counted locks go in a round of their own (one script).
        let counted = |i: &usize| locks[*i].0.kind.is_counted();
        let (shared, plain): (Vec<usize>, Vec<usize>) = (0..locks.len()).partition(counted);
        let mut results: Vec<_> = locks.iter().map(|_| Ok(())).collect();
        let (mut confirm, mut retook) = (Vec::new(), vec![false; self.inner.nodes.len()]);
        for (batch, script, first) in [
            (plain, &script::EXTEND, &mark),
            (shared, &script::SHARED, &"extend".into()),
        ] {
            if batch.is_empty() {
                continue;
            }
            let (mut keys, mut args, mut calls) = (vec![], vec![first.clone()], vec![]);
            for &i in &batch {
                let (lock, ttl) = (&*locks[i].0, locks[i].1);
                // Keys gone from a node are set again while the validity this
                // process measured lasts (and a fenced lock knows its token).
                let retake = (lock.valid_until.is_some_and(|until| Instant::now() < until))
                    .then(|| lock.fencing_token.unwrap_or(0));
                let (own, parts) = (lock.kind).extend(&lock.resources, &lock.value(), ttl, retake);
                keys.extend(own);
                args.extend(parts);
                calls.push((lock.kind, ttl.duration()));
            }
            let args: Vec<&[u8]> = args.iter().map(String::as_bytes).collect();
            let cmd = Command::script(script, &keys, &args);
            let tallies = self.rounds(&cmd, &calls, RENEWED, Ask::EveryReply);
            for (i, tally) in batch.into_iter().zip(tallies) {
                let (lock, ttl) = &mut locks[i];
                results[i] = self.judge(lock, *ttl, tally, attempt, (&mut confirm, &mut retook));
            }
        }
        if !confirm.is_empty() {
            let cmd = Command::script(&script::CONFIRM, &confirm, &[mark.as_bytes()]);
            self.send_only(&cmd, MAX_TTL, |i| retook[i]);
        }
        results
    }

    /// An extension's outcome for `lock`, from its tally: the rules are in
    /// `docs/contract.md`. A re-take is noted for confirmation.
    fn judge(
        &self,
        lock: &mut Lock,
        ttl: Ttl,
        tally: Tally,
        attempt: u32,
        (confirm, retook): (&mut Vec<String>, &mut [bool]),
    ) -> Result<(), LockError> {
        let resource = lock.resources[0].clone();
        if tally.granted() {
            (retook.iter_mut().zip(&tally.report.nodes)).for_each(|(r, n)| *r |= n.retook);
            if tally.report.nodes.iter().any(|n| n.retook) {
                confirm.extend(lock.resources.iter().cloned());
            }
            lock.valid_until = Some(tally.start + tally.validity.unwrap_or_default());
            lock.report = tally.report;
            return Ok(());
        }
        // (Its end, not the time this lock's turn comes after the others'.)
        let end = tally.start + tally.report.elapsed;
        let late = lock.valid_until.is_some_and(|until| end >= until);
        if !late && !tally.refused_by_quorum_complement() {
            return Err(tally.error(&resource, attempt, ttl, Op::Extend));
        }
        self.clean_up(lock.kind, &lock.resources, &lock.token, ttl, &tally.report);
        let reason = match (tally.refused_by_quorum_complement(), tally.taken) {
            (false, _) => Loss::Expired,
            (true, 0) => Loss::Gone(tally.report.refused()),
            (true, nodes) => Loss::Taken(nodes),
        };
        Err(LockError::Lost {
            resource,
            report: tally.report,
            reason,
        })
    }

    /// Releases `lock` on every node: deletes each key that still holds its
    /// token, and nothing else. Returns what each node answered.
    ///
    /// # Errors
    ///
    /// - [`LockError::Lost`] when too few nodes still held the key (see
    ///   [the contract](crate::contract)). Another client may have held the
    ///   lock meanwhile: treat the work done under it accordingly.
    /// - [`LockError::NoQuorum`] when too few nodes answered to tell. The
    ///   keys left expire at the end of their TTL.
    pub fn release(&self, lock: Lock) -> Result<Report, LockError> {
        self.release_token(lock.kind, &lock.resources, &lock.token)
    }

    /// [`release`](Self::release) by kind, resources and token.
    pub(crate) fn release_token(
        &self,
        kind: Kind,
        resources: &[String],
        token: &Token,
    ) -> Result<Report, LockError> {
        self.inner.waiters.close_if_idle();
        let cmd = kind.release(resources, token, Release::Holder);
        let tally = self.round(kind, &cmd, Duration::ZERO, DELETED, Ask::UntilDecided);
        if tally.report.granted() > 0 {
            // This client's own waiters need not hear it from a node.
            (self.inner.waiters).released(resources);
        }
        let lost = tally.refused_by_quorum_complement();
        let (resource, report) = (resources[0].clone(), tally.report);
        let result = if report.granted() >= report.quorum {
            Ok(report)
        } else if report.unusable().count() > report.nodes.len() - report.quorum {
            Err(LockError::Unusable { resource, report })
        } else if lost {
            Err(LockError::Lost {
                resource,
                reason: Loss::Gone(report.refused()),
                report,
            })
        } else {
            Err(LockError::NoQuorum {
                resource,
                attempts: 1,
                report,
            })
        };
        let ids = (resources, token);
        self.observe_counted(Some(What::Released), ids, (0, 0), result.as_ref());
        result
    }

    /// A lock won by a call that was cancelled meanwhile is released.
    fn unless_cancelled(&self, lock: Lock, ttl: Ttl, call: &Call) -> Result<Lock, LockError> {
        if !call.cancelled() {
            return Ok(lock);
        }
        self.clean_up(lock.kind, &lock.resources, &lock.token, ttl, &lock.report);
        Err(cancelled(&lock.resources))
    }

    /// Once an acquisition ends: withdraws the `intent` a writer that
    /// waited may have marked, where its winning script did not
    /// (see [`script::WITHDRAW`]). Sent, not awaited: a lost one lives out
    /// its TTL.
    fn withdraw(&self, kind: Kind, resources: &[String], intent: Option<&str>, ttl: Ttl) {
        let cmd = intent.and_then(|id| kind.withdraw(resources, id));
        if let Some(cmd) = cmd {
            self.send_only(&cmd, ttl.duration(), |_| true);
        }
    }

    /// After a failed attempt: [`send_only`](Self::send_only)s the kind's
    /// clean-up release to every node that may hold our key.
    fn clean_up(&self, kind: Kind, resources: &[String], token: &Token, ttl: Ttl, report: &Report) {
        let cmd = kind.release(resources, token, Release::CleanUp);
        // Not a node that refused: unless it re-took, it holds no key of ours.
        let may_hold = |n: &NodeReport| n.outcome != NodeOutcome::Refused || n.retook;
        self.send_only(&cmd, ttl.duration(), |i| may_hold(&report.nodes[i]));
    }

    /// Writes `cmd` to the nodes `ask` names, awaiting no reply. A node that
    /// cannot be sent it now is owed it while a key set with `ttl` could live.
    fn send_only(&self, cmd: &Command, ttl: Duration, ask: impl Fn(usize) -> bool) {
        let (nodes, now) = (&self.inner.nodes, Instant::now());
        round::send_only(nodes, cmd, self.bounds(now), later(now, ttl), ask);
    }

    fn bounds(&self, start: Instant) -> Bounds {
        let config = &self.inner.config;
        Bounds {
            deadline: start + config.io_timeout,
            connect_timeout: config.connect_timeout,
        }
    }

    /// Runs one round of `cmd` on the nodes `ask` names and counts the
    /// votes by `kind`'s quorum, each node's reply read by `reading`.
    pub(crate) fn round(
        &self,
        kind: Kind,
        cmd: &Command,
        ttl: Duration,
        reading: Reading,
        ask: Ask<'_>,
    ) -> Tally {
        // One TTL, one tally.
        self.rounds(cmd, &[(kind, ttl)], reading, ask)
            .swap_remove(0)
    }

    /// A [`round`](Self::round) of a command that does one call's work for
    /// each kind and TTL of `calls`. Each reply has one part a call. Each
    /// call gets its own tally, and the round is decided once every call's
    /// is. A reply that is not an array is every call's part.
    pub(crate) fn rounds(
        &self,
        cmd: &Command,
        calls: &[(Kind, Duration)],
        reading: Reading,
        ask: Ask<'_>,
    ) -> Vec<Tally> {
        let inner = &*self.inner;
        let n = inner.nodes.len();
        // A call's quorum, grants, refusals, and largest counter.
        let mut counts: Vec<_> = calls.iter().map(|(k, _)| (k.quorum(n), 0, 0, 0)).collect();
        let quorum = counts[0].0;
        let every_reply = matches!(ask, Ask::EveryReply);
        let until_granted = matches!(ask, Ask::UntilGranted);
        let start = Instant::now();
        // The fewest replies that can decide: a quorum of grants, or
        // enough refusals that no quorum is left.
        let to_decide = if every_reply {
            n
        } else if until_granted {
            quorum
        } else {
            quorum.min(n - quorum + 1)
        };
        let asked = |i: usize| !matches!(ask, Ask::Only(asked) if !asked[i]);
        let decided = |result: &Result<Value, Failure>| {
            for (g, (_, yes, no, fence)) in counts.iter_mut().enumerate() {
                match part(result, g).as_ref().map(reading.vote) {
                    Ok(Some(Vote::Yes(counter))) => {
                        *yes += 1;
                        *fence = counter.max(*fence);
                    }
                    _ => *no += 1,
                }
            }
            let done = |&(q, yes, no, _): &(usize, usize, usize, u64)| {
                yes >= q || (!until_granted && no > n - q)
            };
            !every_reply && counts.iter().all(done)
        };
        let (nodes, bounds) = (&inner.nodes, self.bounds(start));
        let replies = round::run(nodes, cmd, start, bounds, asked, (to_decide, decided));
        let elapsed = start.elapsed();
        let calls = calls.iter().zip(counts).enumerate();
        let tallies = calls.map(|(g, (&(_, ttl), (quorum, yes, _, fence)))| {
            let mut taken = 0;
            let nodes = (inner.nodes.iter().zip(&replies))
                .map(|(node, reply)| {
                    let part = part(&reply.result, g);
                    let vote = part.as_ref().ok().and_then(reading.vote);
                    taken += usize::from(vote == Some(Vote::Taken));
                    NodeReport {
                        node: Arc::clone(node.name()),
                        retook: vote == Some(Vote::Retook),
                        outcome: outcome(part, reading),
                        elapsed: reply.elapsed,
                    }
                })
                .collect();
            let validity = self.validity(ttl, elapsed);
            Tally {
                report: Report {
                    nodes,
                    quorum,
                    elapsed,
                    verb: reading.verb,
                },
                validity,
                start,
                too_slow: yes >= quorum && validity.is_none(),
                fence,
                taken,
            }
        });
        tallies.collect()
    }

    /// One round of `cmd` on every node, read until its deadline: each
    /// node's reply, or why there is none.
    pub(crate) fn replies(&self, cmd: &Command) -> Vec<(Arc<str>, Result<Value, NodeOutcome>)> {
        let (nodes, now) = (&self.inner.nodes, Instant::now());
        let bounds = self.bounds(now);
        let replies = round::run(nodes, cmd, now, bounds, |_| true, (nodes.len(), |_| false));
        (nodes.iter().zip(replies))
            .map(|(node, reply)| match reply.result {
                Ok(v) if !matches!(v, Value::ServerError(_)) => (node.name().clone(), Ok(v)),
                result => (node.name().clone(), Err(outcome(result, CONFIRMED))),
            })
            .collect()
    }

    /// The validity a round that took `elapsed` leaves of `ttl`: none if
    /// `ttl - elapsed - drift` is not positive.
    pub(crate) fn validity(&self, ttl: Duration, elapsed: Duration) -> Option<Duration> {
        ttl.checked_sub(elapsed)
            .and_then(|v| v.checked_sub(self.drift(ttl)))
            .filter(|v| !v.is_zero())
    }

    /// `ttl * drift_factor + 2 ms`.
    fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.inner.config.drift_factor) + DRIFT_FLOOR
    }

    /// Checks a TTL: not above [`MAX_TTL`], at least 1 ms, longer than the
    /// drift term.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<Ttl, ArgumentError> {
        if ttl > MAX_TTL {
            return Err(ArgumentError::TtlTooLarge { ttl, max: MAX_TTL });
        }
        let checked = Ttl::whole_ms(ttl);
        if checked.ms() == 0 {
            return Err(ArgumentError::ZeroTtl);
        }
        let drift = self.drift(ttl);
        if checked.duration() <= drift {
            return Err(ArgumentError::TtlBelowDrift { ttl, drift });
        }
        Ok(checked)
    }

    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    pub(crate) fn watchdog(&self) -> &Arc<Watchdog> {
        &self.inner.watchdog
    }
}

/// One acquisition's id, drawn when first needed: at once where an
/// observer hears its events, else at its second attempt, where a writer
/// names its intent by it.
struct Acquisition {
    id: Option<AcquisitionId>,
    /// An attempt was made: from the next one on, a writer marks its intent.
    waited: bool,
    attempted: bool,
}

impl Acquisition {
    fn new(observed: bool) -> Result<Acquisition, LockError> {
        let id = match observed {
            true => Some(AcquisitionId::random()?),
            false => None,
        };
        Ok(Acquisition {
            id,
            waited: false,
            attempted: false,
        })
    }

    /// Before each attempt.
    fn next_attempt(&mut self) -> Result<(), LockError> {
        self.waited = self.attempted;
        self.attempted = true;
        if self.waited && self.id.is_none() {
            self.id = Some(AcquisitionId::random()?);
        }
        Ok(())
    }

    fn id(&self) -> Option<&str> {
        self.id.as_ref().map(AcquisitionId::as_str)
    }

    /// The id a writer marks its intent with: from its second attempt on.
    fn intent(&self) -> Option<&str> {
        self.id().filter(|_| self.waited)
    }
}

/// One acquisition's id: 64 random bits as 16 hex digits, the same for all
/// its attempts (see [`Event::acquisition`](crate::Event::acquisition)).
struct AcquisitionId([u8; 16]);

impl AcquisitionId {
    fn random() -> Result<AcquisitionId, LockError> {
        let bits = getrandom::u64().map_err(|e| LockError::Random(e.into()))?;
        let mut hex = [0; 16];
        for (i, digit) in hex.iter_mut().enumerate() {
            let nibble = (bits >> (60 - 4 * i)) & 0xf;
            *digit = b"0123456789abcdef"[nibble as usize];
        }
        Ok(AcquisitionId(hex))
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

fn cancelled(resources: &[String]) -> LockError {
    let resource = resources[0].clone();
    LockError::Cancelled { resource }
}

fn outcome(result: Result<Value, Failure>, reading: Reading) -> NodeOutcome {
    match result {
        Err(Failure::TimedOut | Failure::ConnectTimedOut) => NodeOutcome::TimedOut,
        Err(Failure::NotAwaited) => NodeOutcome::NotAwaited,
        Err(Failure::Error(e)) => NodeOutcome::Failed(e),
        Ok(Value::ServerError(e)) => NodeOutcome::Failed(match e.code() {
            "WRONGKIND" => NodeError::OtherKind(e.details().unwrap_or_default().to_string()),
            "LAYOUT" => NodeError::OtherVersion(e.details().unwrap_or_default().to_string()),
            _ => NodeError::Server(server_error_text(&e)),
        }),
        Ok(value) => match (reading.vote)(&value) {
            Some(Vote::Yes(_)) => NodeOutcome::Granted,
            Some(_) => NodeOutcome::Refused,
            None => NodeOutcome::Failed(NodeError::Protocol(format!("{value:?}"))),
        },
    }
}

/// Call `g`'s part of a node's reply (see [`Redlock::rounds`]).
fn part(reply: &Result<Value, Failure>, g: usize) -> Result<Value, Failure> {
    match reply {
        Ok(Value::Array(parts)) => Ok(parts.get(g).cloned().unwrap_or(Value::Nil)),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlock_sync_testing::Cluster;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Whether no thread of `locks` is counted awake on its pace: true
    /// whenever no operation is under way.
    fn pace_idle(locks: &Redlock) -> bool {
        let pace = locks.inner.nodes[0].pace();
        pace.hold();
        pace.release()
    }

    #[test]
    fn one_round_extends_many_locks_and_judges_each_on_its_own() {
        let cluster = Cluster::start(3).expect("3 redis-server nodes");
        let locks = Redlock::builder(cluster.urls()).build().unwrap();
        let ttl = Duration::from_secs(10);
        let fenced = LockOptions::new(ttl).kind(Kind::Fenced);
        let mut kept = locks.acquire("kept", ttl).unwrap();
        let mut taken = locks.acquire("taken", ttl).unwrap();
        let mut retaken = locks.acquire(["retaken:a", "retaken:b"], ttl).unwrap();
        let mut garbled = locks.acquire("garbled", fenced).unwrap();
        // Another holder on two nodes; a key gone from node 0; a fencing
        // counter that is not a number on node 1.
        for i in [0, 1] {
            cluster.node(i).set("taken", "someone-else").unwrap();
        }
        cluster.node(0).query(&["DEL", "retaken:b"]).unwrap();
        let counter = &crate::kind::fence_keys("garbled")[1];
        cluster.node(1).set(counter, "not a number").unwrap();
        let ttl = Ttl::whole_ms(ttl);
        let mut batch = [
            (&mut kept, ttl),
            (&mut taken, ttl),
            (&mut retaken, ttl),
            (&mut garbled, ttl),
        ];
        let results = locks.extend_all(&mut batch, 1);
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert!(
            matches!(results[1], Err(LockError::Lost { .. })),
            "{:?}",
            results[1]
        );
        assert!(results[2].is_ok(), "{:?}", results[2]);
        assert!(results[3].is_ok(), "{:?}", results[3]);
        let retook: Vec<_> = retaken.report.nodes.iter().map(|n| n.retook).collect();
        assert!(retook[0] && !retook[2], "{:?}", retaken.report);
        assert_eq!(
            cluster.node(0).get("retaken:b").unwrap().as_deref(),
            Some(&*retaken.token.to_string())
        );
        let node1 = &garbled.report.nodes[1].outcome;
        assert!(
            matches!(node1, NodeOutcome::Failed(_) | NodeOutcome::NotAwaited),
            "{node1:?}"
        );
        // One round: the same elapsed time in every lock's report.
        assert_eq!(kept.report.elapsed, retaken.report.elapsed);
        assert_eq!(kept.report.elapsed, garbled.report.elapsed);
        for lock in [kept, retaken, garbled] {
            locks.release(lock).unwrap();
        }
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
             queued commands now wait out a recheck sleep in every round"
        );
    }
}
