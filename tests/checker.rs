//! The randomized checker of the contract (docs/contract.md): several
//! clients, each with several threads, contend for locks held in the three
//! ways a program holds them (an explicit `Lock`, some of which extend
//! after their validity ran out; a guard from `lock`; a `with_lock`
//! closure), while the fault classes of the contract's table hit five
//! nodes, one class at a time. Each hold is of one of these roles: a
//! fenced or a plain writer of one resource, a plain writer of two
//! resources as one lock, a reader ([`Kind::Shared`]) of either resource,
//! or a holder of a semaphore of 1, 2 or 3 permits, each on a resource of
//! its own:
//!
//! | class | the table says |
//! |---|---|
//! | restarts without persistence, guard on | exclusive |
//! | restarts with persistence | exclusive |
//! | restarts without persistence, guard off | told |
//! | data lost on a minority (a flush, no restart) | told |
//! | data lost on a majority | told |
//! | partitions | exclusive |
//! | commands delayed longer than a validity, then reordered | exclusive |
//! | nodes paused shorter and longer than the TTL | exclusive |
//! | latency and connection resets | exclusive |
//!
//! The holders themselves pause past their validity now and then, in every
//! class. Between two classes no fault runs for longer than the longest TTL,
//! so that every lock of one class has ended, or been told, before the next
//! begins; an overlap is charged to the class in which the later holder
//! acquired.
//!
//! The oracle follows the table. A holder's *claimed hold* runs from its
//! acquisition to the end of the last validity an `Ok` gave it, gaps
//! included; an `Ok` release or unlock ends it at its start, a gap before
//! it included. A *conflict* is a writer's claim overlapping any other
//! claim of its resource, or `K + 1` claims of a `K`-permit semaphore
//! overlapping. Where the table says exclusive, there is none. Everywhere,
//! of a conflict's claims, those that began first are told (for a
//! semaphore, all but `K - 1` of them): no call of theirs that started
//! after the last claim began returns `Ok`, and a guard's `is_held` is
//! false once the validity it had then (or an extension then in flight
//! gave it) is over. Readers' claims, and up to `K` holders', do overlap:
//! the run fails if they never did. Writers' fencing tokens increase in the
//! order the acquisitions returned, in the classes where the fenced
//! guarantee holds (no data lost, or the guard on).
//!
//! Five cases also run on purpose, each in a thread of its own ([`Case`]):
//! a permit holder renewed on a majority short of `q`, readers of mixed
//! TTLs before a writer, a reader renewing behind a waiting writer, a
//! writer behind permit holders, and two writers that give up. Each checks
//! its own rule, and its holds join the log. Each must occur at least
//! [`CASE_MINIMUM`] times in a run of the default length.
//!
//! It runs for about 45 s (each class for 5 s, in turn).
//! `REDLOCK_CHECKER_SECS=600` runs longer, cycling through the classes
//! (with `REDLOCK_SYNC_TEST_TIMEOUT=900`, past the harness's time bound),
//! and `REDLOCK_CHECKER_SEED=<u64>` replays a fault schedule (thread timing
//! still varies). Run with `--nocapture` to see the counts per class.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::{cluster, fenced, wait_until};
use redlock_sync::{
    intents_key, Kind, Lock, LockError, LockOptions, Loss, NodeOutcome, Patience, Redlock,
    RetryPolicy,
};
use redlock_sync_testing::{Cluster, Fault, Proxy};

/// The writers' and readers' resources: plain writers also take both as
/// one lock.
const RESOURCES: [&str; 2] = ["checked", "checked-b"];
const CLIENTS: usize = 3;
const THREADS_PER_CLIENT: usize = 3;
const NODES: usize = 5;
/// TTLs drawn for acquire and extend.
const TTLS: [Duration; 2] = [Duration::from_millis(300), Duration::from_millis(800)];
/// Above the longest TTL.
const RESTART_GRACE: Duration = Duration::from_secs(1);
/// How long each class runs, faults and quiet end together.
const CLASS_TIME: Duration = Duration::from_secs(5);
/// The quiet end of each class: no fault, for twice the longest TTL.
const QUIET: Duration = Duration::from_millis(1600);
/// How long after another's hold began an extension still in flight may
/// have been started before it (a watchdog round: connect and I/O
/// timeouts, with room for a busy machine).
const ROUND: Duration = Duration::from_millis(150);
const DEFAULT_SECS: u64 = 45;

/// A small xorshift generator: the schedule needs variety, not quality.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low + 1))
    }
}

/// What the contract's table says of a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Exclusive,
    Told,
}

/// One fault class: its name, what the table says, whether its clients run
/// with the restart guard, whether the fencing order is asserted, and its
/// faults.
struct Class {
    name: &'static str,
    cell: Cell,
    guard: bool,
    fencing: bool,
    fault: Hurt,
}

/// The faults a class makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hurt {
    Restart,
    RestartPersisted,
    LoseMinority,
    LoseMajority,
    Partition,
    DelayPastValidity,
    Pause,
    LatencyAndResets,
}

const CLASSES: [Class; 9] = [
    Class {
        name: "restarts without persistence, guard on",
        cell: Cell::Exclusive,
        guard: true,
        fencing: true,
        fault: Hurt::Restart,
    },
    Class {
        name: "restarts with persistence",
        cell: Cell::Exclusive,
        guard: false,
        fencing: true,
        fault: Hurt::RestartPersisted,
    },
    Class {
        name: "restarts without persistence, guard off",
        cell: Cell::Told,
        guard: false,
        fencing: false,
        fault: Hurt::Restart,
    },
    Class {
        name: "data lost on a minority",
        cell: Cell::Told,
        guard: false,
        fencing: false,
        fault: Hurt::LoseMinority,
    },
    Class {
        name: "data lost on a majority",
        cell: Cell::Told,
        guard: false,
        fencing: false,
        fault: Hurt::LoseMajority,
    },
    Class {
        name: "partitions",
        cell: Cell::Exclusive,
        guard: true,
        fencing: true,
        fault: Hurt::Partition,
    },
    Class {
        name: "commands delayed past a validity",
        cell: Cell::Exclusive,
        guard: true,
        fencing: true,
        fault: Hurt::DelayPastValidity,
    },
    Class {
        name: "nodes paused",
        cell: Cell::Exclusive,
        guard: true,
        fencing: true,
        fault: Hurt::Pause,
    },
    Class {
        name: "latency and resets",
        cell: Cell::Exclusive,
        guard: true,
        fencing: true,
        fault: Hurt::LatencyAndResets,
    },
];

/// What a hold is of: a fenced or plain writer of the first resource, a
/// plain writer of both as one lock, a reader of one, or a permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Fenced,
    Plain,
    Pair,
    Reader(usize),
    Permit(u32),
}

impl Role {
    fn draw(rng: &mut Rng) -> Role {
        match rng.below(12) {
            0..=2 => Role::Fenced,
            3 | 4 => Role::Plain,
            5 => Role::Pair,
            6 | 7 => Role::Reader(0),
            8 => Role::Reader(1),
            k => Role::Permit(k as u32 - 8),
        }
    }

    fn resources(self) -> Vec<String> {
        match self {
            Role::Permit(k) => vec![format!("permits-{k}")],
            Role::Pair => RESOURCES.map(String::from).to_vec(),
            Role::Reader(i) => vec![RESOURCES[i].to_string()],
            Role::Fenced | Role::Plain => vec![RESOURCES[0].to_string()],
        }
    }

    fn options(self, ttl: Duration) -> LockOptions {
        match self {
            Role::Fenced => fenced(ttl),
            Role::Plain | Role::Pair => LockOptions::new(ttl),
            Role::Reader(_) => LockOptions::new(ttl).kind(Kind::Shared),
            Role::Permit(k) => LockOptions::new(ttl).kind(Kind::Semaphore(k)),
        }
    }

    fn is_reader(self) -> bool {
        matches!(self, Role::Reader(_))
    }
}

/// How a holder held the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Lock,
    Guard,
    WithLock,
}

/// One hold, as its holder saw it.
#[derive(Debug)]
struct Hold {
    who: (usize, usize),
    role: Role,
    /// The role's resources, or a case's own.
    resources: Vec<String>,
    holder: Holder,
    /// The class in which the acquisition returned.
    class: usize,
    fence: u64,
    /// When the acquisition returned: the claim begins.
    start: Instant,
    /// The end of the last validity an `Ok` gave, or the start of an `Ok`
    /// release or unlock, whichever is later.
    claim_end: Instant,
    /// When each call that returned `Ok` after the acquisition started.
    oks: Vec<Instant>,
    /// A guard's samples while it said held: when, and the validity
    /// deadline it had then.
    held: Vec<(Instant, Instant)>,
}

impl Hold {
    fn new(who: (usize, usize), role: Role, holder: Holder, class: usize, fence: u64) -> Hold {
        let start = Instant::now();
        Hold {
            who,
            role,
            resources: role.resources(),
            holder,
            class,
            fence,
            start,
            claim_end: start,
            oks: Vec::new(),
            held: Vec::new(),
        }
    }

    /// An extension that started at `at` returned `Ok`, valid until `until`.
    fn extended(&mut self, at: Instant, until: Instant) {
        self.oks.push(at);
        self.claim_end = self.claim_end.max(until);
    }

    /// The holder gave the lock up at `at` (a release or unlock began): the
    /// claim ends there at the latest; if the release said the lock was
    /// held throughout (`ok`), it runs up to there, a gap before included.
    fn released(&mut self, at: Instant, ok: bool) {
        if ok {
            self.oks.push(at);
            self.claim_end = at;
        }
        self.claim_end = self.claim_end.min(at);
    }

    /// A guard says it is held, with `validity` left.
    fn sample(&mut self, validity: Duration) {
        let now = Instant::now();
        if !validity.is_zero() {
            self.held.push((now, now + validity));
            self.claim_end = self.claim_end.max(now + validity);
        }
    }

    /// Whether this holder was told that another's hold began at `since`:
    /// no call of it started after that returned `Ok`, and a guard said
    /// held no later than the deadline it had then (or that an extension
    /// in flight then gave it).
    fn told_since(&self, since: Instant) -> bool {
        let admitted = (self.held.iter())
            .filter(|(at, _)| *at <= since + ROUND)
            .map(|(_, deadline)| *deadline)
            .max()
            .unwrap_or(self.start);
        self.oks.iter().all(|&at| at <= since) && self.held.iter().all(|(at, _)| *at <= admitted)
    }
}

/// What the run shares: the clients (without and with the restart guard),
/// the class under way, the log, and the counts.
struct Run {
    clients: [Vec<Redlock>; 2],
    class: AtomicUsize,
    stop: AtomicBool,
    log: Mutex<Vec<Hold>>,
    failures: Mutex<BTreeMap<String, u64>>,
    /// How often each case occurred, what the cases found wrong, and how
    /// many episodes began (each names its resource).
    cases: Mutex<BTreeMap<Case, u64>>,
    breaches: Mutex<Vec<(Case, String)>>,
    episodes: AtomicUsize,
}

impl Run {
    /// Counts a failed acquisition (no hold to log), or panics for an error
    /// the faults cannot cause.
    fn failed<T>(&self, e: &LockError, holder: Holder) -> Option<T> {
        let kind = match e {
            LockError::Contended { .. } => "contended",
            LockError::NoQuorum { .. } => "no quorum",
            LockError::TooSlow { .. } => "too slow",
            LockError::Lost { .. } => "lost",
            other => panic!("{holder:?}: an error the faults cannot cause: {other}"),
        };
        let mut failures = self.failures.lock().unwrap();
        *failures.entry(format!("{holder:?}: {kind}")).or_default() += 1;
        None
    }
}

/// How long to run, and the seed.
fn settings() -> (Duration, u64) {
    let secs = std::env::var("REDLOCK_CHECKER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let seed = std::env::var("REDLOCK_CHECKER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| getrandom::u64().expect("a random seed"));
    (Duration::from_secs(secs), seed)
}

fn client(proxies: &[Proxy], grace: Duration) -> Redlock {
    Redlock::builder(proxies.iter().map(Proxy::url))
        .retry_policy(
            RetryPolicy::default()
                .retries(5)
                .delay(Duration::from_millis(5))
                .jitter(Duration::from_millis(20)),
        )
        .io_timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(50))
        .restart_grace(grace)
        .build()
        .expect("valid checker configuration")
}

/// One worker thread: holds the lock one way or another, until `stop`.
fn work(run: &Run, who: (usize, usize), seed: u64) {
    let mut rng = Rng::new(seed);
    while !run.stop.load(Ordering::Relaxed) {
        let class = run.class.load(Ordering::Relaxed);
        let locks = &run.clients[usize::from(CLASSES[class].guard)][who.0];
        let ttl = TTLS[rng.below(2) as usize];
        let role = Role::draw(&mut rng);
        let hold = match rng.below(4) {
            0 => scoped(run, locks, (who, role), ttl, &mut rng),
            1 => guarded(run, locks, (who, role), ttl, &mut rng),
            _ => explicit(run, locks, (who, role), ttl, &mut rng),
        };
        if let Some(hold) = hold {
            run.log.lock().unwrap().push(hold);
        }
    }
}

/// An explicit lock: acquire, work (sometimes past the validity, like a
/// holder stuck in a GC pause), sometimes extend (also after the validity
/// ran out), release.
fn explicit(
    run: &Run,
    locks: &Redlock,
    (who, role): ((usize, usize), Role),
    ttl: Duration,
    rng: &mut Rng,
) -> Option<Hold> {
    let mut lock = match locks.acquire(role.resources(), role.options(ttl)) {
        Ok(lock) => lock,
        Err(e) => return run.failed(&e, Holder::Lock),
    };
    let class = run.class.load(Ordering::Relaxed);
    let fence = lock.fencing_token().unwrap_or_default();
    let mut hold = Hold::new(who, role, Holder::Lock, class, fence);
    hold.claim_end = lock.valid_until();
    let (work, extend) = match rng.below(60) {
        0..=2 => (lock.validity() + rng.millis(1, 60), true),
        3..=6 => (lock.validity().mul_f64(0.6), true),
        10..=19 => (rng.millis(0, 20), true),
        20 => (lock.validity() + rng.millis(1, 100), false),
        _ => (rng.millis(0, 20), false),
    };
    thread::sleep(work);
    if extend {
        let mut extend = |hold: &mut Hold| {
            let at = Instant::now();
            let result = locks.extend(&mut lock, ttl);
            if result.is_ok() {
                hold.extended(at, lock.valid_until());
                thread::sleep(work.min(lock.validity().mul_f64(0.6)));
            }
            result
        };
        // Too few answered: now and then, the holder tries again long after
        // its validity, when commands held up meanwhile may have landed.
        if matches!(extend(&mut hold), Err(LockError::NoQuorum { .. })) && rng.below(2) == 0 {
            thread::sleep(rng.millis(1000, 2000));
            let _ = extend(&mut hold);
        }
    }
    let at = Instant::now();
    let released = locks.release(lock).is_ok();
    hold.released(at, released);
    Some(hold)
}

/// How long a guard or a closure works: mostly briefly, sometimes for
/// longer than the TTL, so that its watchdog extends it.
fn guard_work(ttl: Duration, rng: &mut Rng) -> Duration {
    if rng.below(4) == 0 {
        ttl.mul_f64(1.5 + rng.below(100) as f64 / 100.0)
    } else {
        rng.millis(0, 20)
    }
}

/// Samples the guard while it works, and stops working as soon as it says
/// the lock is no longer held.
fn hold_while_held(guard: &redlock_sync::LockGuard, hold: &mut Hold, work: Duration) {
    let start = Instant::now();
    while start.elapsed() < work && guard.is_held() {
        hold.sample(guard.validity());
        thread::sleep(Duration::from_millis(5).min(work.saturating_sub(start.elapsed())));
    }
    hold.sample(guard.validity());
}

/// A guard from `lock`, kept by the watchdog while it works.
fn guarded(
    run: &Run,
    locks: &Redlock,
    (who, role): ((usize, usize), Role),
    ttl: Duration,
    rng: &mut Rng,
) -> Option<Hold> {
    let guard = match locks.lock(role.resources(), role.options(ttl)) {
        Ok(guard) => guard,
        Err(e) => return run.failed(&e, Holder::Guard),
    };
    let class = run.class.load(Ordering::Relaxed);
    let fence = guard.fencing_token().unwrap_or_default();
    let mut hold = Hold::new(who, role, Holder::Guard, class, fence);
    hold_while_held(&guard, &mut hold, guard_work(ttl, rng));
    let at = Instant::now();
    let released = guard.unlock().is_ok();
    hold.released(at, released);
    Some(hold)
}

/// A `with_lock` closure, kept by the watchdog while it works.
fn scoped(
    run: &Run,
    locks: &Redlock,
    (who, role): ((usize, usize), Role),
    ttl: Duration,
    rng: &mut Rng,
) -> Option<Hold> {
    let work = guard_work(ttl, rng);
    let mut held = None;
    let result = locks.with_lock(role.resources(), role.options(ttl), |guard| {
        let class = run.class.load(Ordering::Relaxed);
        let fence = guard.fencing_token().unwrap_or_default();
        let mut hold = Hold::new(who, role, Holder::WithLock, class, fence);
        hold_while_held(guard, &mut hold, work);
        held = Some((hold, Instant::now()));
        Ok::<(), LockError>(())
    });
    match (held, result) {
        (Some((mut hold, end)), result) => {
            hold.released(end, result.is_ok());
            Some(hold)
        }
        (None, Err(e)) => run.failed(&e, Holder::WithLock),
        (None, Ok(())) => unreachable!("with_lock ran no closure"),
    }
}

/// The cases each run makes on purpose, each by a thread of its own, on a
/// fresh resource per episode, while the class's faults go on. Each one
/// holds a rule the random holders rarely meet; the end of the run
/// prints how often each occurred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Case {
    /// [`short_of_quorum`].
    ShortOfQuorum,
    /// [`mixed_ttls`].
    MixedTtls,
    /// [`renewed_behind_writer`].
    RenewedBehindWriter,
    /// [`writer_behind_permits`].
    WriterBehindPermits,
    /// [`writer_gave_up`].
    WriterGaveUp,
}

const CASES: [Case; 5] = [
    Case::ShortOfQuorum,
    Case::MixedTtls,
    Case::RenewedBehindWriter,
    Case::WriterBehindPermits,
    Case::WriterGaveUp,
];

/// How many times each case must occur in a run of the default length.
const CASE_MINIMUM: u64 = 10;

/// How soon after the last waiting writer gave up a reader gets in: a
/// retry pause and a few rounds, far below the writers' TTL.
const GAVE_UP_BOUND: Duration = Duration::from_millis(400);

/// The writers' TTL in [`writer_gave_up`]: an intent left behind would
/// keep readers out this long.
const GAVE_UP_TTL: Duration = Duration::from_millis(2000);

/// An explicit lock a case holds, and its claim, logged on release.
struct Held {
    lock: Lock,
    hold: Hold,
}

impl Held {
    /// Acquires `resource` as `role` with `options`; `waits`: the waiting
    /// form, else one attempt.
    fn take(
        stage: &Stage,
        role: Role,
        resource: &str,
        options: LockOptions,
        waits: bool,
    ) -> Result<Held, LockError> {
        let result = if waits {
            stage.locks().acquire(resource, options)
        } else {
            stage.locks().try_acquire(resource, options)
        };
        let lock = result?;
        let class = stage.run.class.load(Ordering::Relaxed);
        let mut hold = Hold::new(stage.who, role, Holder::Lock, class, 0);
        hold.resources = vec![resource.to_string()];
        hold.claim_end = lock.valid_until();
        Ok(Held { lock, hold })
    }

    /// Which nodes granted the acquisition: their command ran, so our
    /// member was there, and nothing but our own calls writes it again.
    fn granted(&self) -> Vec<bool> {
        self.lock
            .report()
            .nodes
            .iter()
            .map(|n| n.outcome == NodeOutcome::Granted)
            .collect()
    }

    fn extend(&mut self, stage: &Stage, ttl: Duration) -> Result<(), LockError> {
        let at = Instant::now();
        let result = stage.locks().extend(&mut self.lock, ttl);
        if result.is_ok() {
            self.hold.extended(at, self.lock.valid_until());
        }
        result
    }

    fn release(mut self, stage: &Stage) {
        let at = Instant::now();
        let released = stage.locks().release(self.lock).is_ok();
        self.hold.released(at, released);
        stage.run.log.lock().unwrap().push(self.hold);
    }
}

/// What a case's thread works with: the run, the nodes (read and written
/// directly, past the proxies), the faults' calm, and who it is.
struct Stage<'a> {
    run: &'a Run,
    faults: &'a Faults<'a>,
    who: (usize, usize),
}

impl Stage<'_> {
    /// The client of the class under way.
    fn locks(&self) -> &Redlock {
        let class = self.run.class.load(Ordering::Relaxed);
        &self.run.clients[usize::from(CLASSES[class].guard)][self.who.1 % CLIENTS]
    }

    /// A fresh resource for one episode of `case`.
    fn resource(&self, case: Case) -> String {
        let n = self.run.episodes.fetch_add(1, Ordering::Relaxed);
        format!("case-{case:?}-{n}")
    }

    fn occurred(&self, case: Case) {
        *self.run.cases.lock().unwrap().entry(case).or_default() += 1;
    }

    fn breach(&self, case: Case, what: String) {
        let class = CLASSES[self.run.class.load(Ordering::Relaxed)].name;
        let seen = format!("{case:?} ({class}): {what}");
        self.run.breaches.lock().unwrap().push((case, seen));
    }

    /// Whether node `i` holds `member` in the sorted set `key`, live by the
    /// node's clock (an error, a paused or stopped node: no).
    fn holds_live(&self, i: usize, key: &str, member: &str) -> bool {
        const LIVE: &str = "local s = redis.call('zscore', KEYS[1], ARGV[1])\n\
            local t = redis.call('time')\n\
            if s and tonumber(s) > t[1] * 1000 + math.floor(t[2] / 1000) then return 1 end\n\
            return 0";
        let node = self.faults.nodes.node(i);
        let reply = node.query(&["EVAL", LIVE, "1", key, member]);
        matches!(reply, Ok(redis::Value::Int(1)))
    }

    /// The nodes where a writer's intent on `resource` stands.
    fn intents(&self, resource: &str) -> Vec<bool> {
        let key = intents_key(resource);
        (0..NODES)
            .map(|i| {
                let node = self.faults.nodes.node(i);
                let reply = node.query(&["EXISTS", &key]);
                matches!(reply, Ok(redis::Value::Int(1)))
            })
            .collect()
    }
}

/// One case's thread: episodes of `case`, until `stop`.
fn stage(stage: &Stage, case: Case, seed: u64) {
    let mut rng = Rng::new(seed);
    while !stage.run.stop.load(Ordering::Relaxed) {
        match case {
            Case::ShortOfQuorum => short_of_quorum(stage),
            Case::MixedTtls => mixed_ttls(stage),
            Case::RenewedBehindWriter => renewed_behind_writer(stage),
            Case::WriterBehindPermits => writer_behind_permits(stage),
            // Judged only in calm: it waits for one.
            Case::WriterGaveUp if !stage.faults.calm_since(Instant::now()) => {
                thread::sleep(Duration::from_millis(10));
                continue;
            }
            // Back to back while calm: calm is short.
            Case::WriterGaveUp => {
                writer_gave_up(stage);
                continue;
            }
        }
        thread::sleep(rng.millis(20, 200));
    }
}

/// A holder of 2 permits on five nodes (q = 4) whose member is deleted on
/// two nodes that granted it: its next extension renews on at most three,
/// a majority short of `q`. It must not be told `Ok`, nor `NoQuorum`
/// where every node answered.
fn short_of_quorum(stage: &Stage) {
    let resource = stage.resource(Case::ShortOfQuorum);
    let options = LockOptions::new(TTLS[1]).kind(Kind::Semaphore(2));
    let Ok(mut held) = Held::take(stage, Role::Permit(2), &resource, options, true) else {
        return;
    };
    let member = held.lock.token().to_string();
    let granted = held.granted();
    let mut deleted = 0;
    for i in (0..NODES).filter(|&i| granted[i]).take(NODES - 4 + 1) {
        let node = stage.faults.nodes.node(i);
        let reply = node.query(&["ZREM", &resource, &member]);
        deleted += usize::from(matches!(reply, Ok(redis::Value::Int(1))));
    }
    if deleted == NODES - 4 + 1 {
        stage.occurred(Case::ShortOfQuorum);
        let result = held.extend(stage, TTLS[1]);
        // Where every node answered, too few renewed: that is a loss.
        let answered = |report: &redlock_sync::Report| {
            let mut nodes = report.nodes.iter();
            nodes.all(|n| matches!(n.outcome, NodeOutcome::Granted | NodeOutcome::Refused))
        };
        if result.is_ok() {
            let what = format!("a 2-permit holder renewed with its member gone on {deleted} of {NODES} nodes (q = 4)");
            stage.breach(Case::ShortOfQuorum, what);
        } else if let Err(LockError::NoQuorum { report, .. }) = &result {
            if answered(report) {
                let what = format!("a 2-permit holder with its member gone on {deleted} of {NODES} nodes, every node answering, was told {result:?}, not Lost");
                stage.breach(Case::ShortOfQuorum, what);
            }
        }
    }
    held.release(stage);
}

/// A long reader, then a short one: once the short one's TTL is over, a
/// plain writer tries once. The long reader still holds, so the writer
/// must be refused (the oracle sees an overlap otherwise).
fn mixed_ttls(stage: &Stage) {
    let resource = stage.resource(Case::MixedTtls);
    let shared = |ttl: Duration| LockOptions::new(ttl).kind(Kind::Shared);
    let long_ttl = Duration::from_millis(1500);
    let Ok(long) = Held::take(stage, Role::Reader(0), &resource, shared(long_ttl), true) else {
        return;
    };
    let short = Held::take(stage, Role::Reader(0), &resource, shared(TTLS[0]), true);
    if let Ok(short) = short {
        // Past the short reader's expiry on every node.
        thread::sleep(TTLS[0] + Duration::from_millis(100));
        // Only where the long one is still valid for a while.
        if long.lock.valid_until() > Instant::now() + Duration::from_millis(200) {
            stage.occurred(Case::MixedTtls);
            let options = LockOptions::new(TTLS[0]);
            let writer = Held::take(stage, Role::Plain, &resource, options, false);
            // Both claims last a while: an overlap is no matter of timing.
            thread::sleep(Duration::from_millis(100));
            if let Ok(writer) = writer {
                writer.release(stage);
            }
        }
        stage.run.log.lock().unwrap().push(short.hold);
    }
    long.release(stage);
}

/// A reader renews its lock every 100 ms while a plain writer waits
/// behind it (its intent set). A node that refuses the renewal must not
/// hold the reader's member, live, just after.
fn renewed_behind_writer(stage: &Stage) {
    let resource = stage.resource(Case::RenewedBehindWriter);
    let ttl = TTLS[0];
    let options = LockOptions::new(ttl).kind(Kind::Shared);
    let Ok(mut reader) = Held::take(stage, Role::Reader(0), &resource, options, true) else {
        return;
    };
    let member = reader.lock.token().to_string();
    let granted = reader.granted();
    let waiting = AtomicBool::new(true);
    thread::scope(|s| {
        let writer = s.spawn(|| {
            let patience = Patience::For(Duration::from_millis(450));
            let options = LockOptions::new(ttl).patience(patience);
            let writer = Held::take(stage, Role::Plain, &resource, options, true);
            waiting.store(false, Ordering::Relaxed);
            writer
        });
        let began = Instant::now();
        let mut occurred = false;
        for _ in 0..5 {
            thread::sleep(Duration::from_millis(100));
            let behind =
                waiting.load(Ordering::Relaxed) && began.elapsed() > Duration::from_millis(60);
            match reader.extend(stage, ttl) {
                Ok(()) => occurred |= behind,
                Err(LockError::Lost { reason, report, .. }) if reason != Loss::Expired => {
                    occurred |= behind;
                    let refused = report
                        .nodes
                        .iter()
                        .enumerate()
                        .filter(|(i, n)| granted[*i] && n.outcome == NodeOutcome::Refused)
                        .map(|(i, _)| i);
                    for i in refused.filter(|&i| stage.holds_live(i, &resource, &member)) {
                        let what = format!("node {i} refused a reader's renewal while it held its member (a writer waiting: {behind})");
                        stage.breach(Case::RenewedBehindWriter, what);
                    }
                    break;
                }
                Err(_) => break,
            }
        }
        if occurred {
            stage.occurred(Case::RenewedBehindWriter);
        }
        reader.release(stage);
        if let Ok(writer) = writer.join().unwrap() {
            writer.release(stage);
        }
    });
}

/// Two permit holders of 2 permits and a plain writer waiting behind them;
/// one leaves, and a new permit holder tries once. Where the writer's
/// intent stood on more nodes than `N - q` before and after that
/// attempt, the new holder must be refused.
fn writer_behind_permits(stage: &Stage) {
    let resource = stage.resource(Case::WriterBehindPermits);
    let ttl = TTLS[1];
    let options = || LockOptions::new(ttl).kind(Kind::Semaphore(2));
    let Ok(first) = Held::take(stage, Role::Permit(2), &resource, options(), true) else {
        return;
    };
    let Ok(second) = Held::take(stage, Role::Permit(2), &resource, options(), true) else {
        first.release(stage);
        return;
    };
    let waiting = AtomicBool::new(true);
    thread::scope(|s| {
        let writer = s.spawn(|| {
            let patience = Patience::For(Duration::from_millis(1500));
            let options = LockOptions::new(ttl).patience(patience);
            let writer = Held::take(stage, Role::Plain, &resource, options, true);
            waiting.store(false, Ordering::Relaxed);
            writer
        });
        thread::sleep(Duration::from_millis(100));
        first.release(stage);
        let since = Instant::now();
        let class = stage.run.class.load(Ordering::Relaxed);
        let before = stage.intents(&resource);
        let third = Held::take(stage, Role::Permit(2), &resource, options(), false);
        let after = stage.intents(&resource);
        let stood = (0..NODES).filter(|&i| before[i] && after[i]).count();
        // A flush between the two reads could drop an intent that the
        // writer set again: judged only where no data was lost.
        let kept = CLASSES[class].cell == Cell::Exclusive
            && stage.run.class.load(Ordering::Relaxed) == class;
        let judged = kept || stage.faults.calm_since(since);
        if judged && stood > NODES - 4 && waiting.load(Ordering::Relaxed) {
            stage.occurred(Case::WriterBehindPermits);
            if third.is_ok() {
                let what = format!(
                    "a permit holder got in while a writer's intent stood on {stood} nodes"
                );
                stage.breach(Case::WriterBehindPermits, what);
            }
        }
        if let Ok(third) = third {
            third.release(stage);
        }
        second.release(stage);
        if let Ok(writer) = writer.join().unwrap() {
            writer.release(stage);
        }
    });
}

/// A reader holds; two plain writers wait behind it, one giving up
/// before the other. While the second waits (its intent on a majority),
/// a new reader is refused; once it gives up too, a new reader gets in
/// within a retry pause or two, not a writer's TTL. Judged only where no
/// fault ran since the episode began (and none could still be felt).
fn writer_gave_up(stage: &Stage) {
    let began = Instant::now();
    let resource = stage.resource(Case::WriterGaveUp);
    let shared = |ttl: Duration| LockOptions::new(ttl).kind(Kind::Shared);
    let first = Held::take(stage, Role::Reader(0), &resource, shared(TTLS[1]), true);
    let Ok(first) = first else {
        return;
    };
    let writer = |patience: u64| {
        let patience = Patience::For(Duration::from_millis(patience));
        let options = LockOptions::new(GAVE_UP_TTL).patience(patience);
        Held::take(stage, Role::Plain, &resource, options, true)
    };
    let mut breaches = Vec::new();
    thread::scope(|s| {
        // The second cannot give up before its patience ends.
        let waits_until = Instant::now() + Duration::from_millis(150);
        let long = s.spawn(|| writer(150));
        let short = s.spawn(|| writer(60));
        let short = short.join().unwrap();
        // Judged where the second's intent stood on a majority throughout.
        let before = stage.intents(&resource);
        let beside = Held::take(stage, Role::Reader(0), &resource, shared(TTLS[0]), false);
        let after = stage.intents(&resource);
        let stood = (0..NODES).filter(|&i| before[i] && after[i]).count();
        let judged = stood > NODES / 2 && Instant::now() < waits_until;
        if judged && beside.is_ok() {
            breaches.push("a reader got in beside a writer still waiting".to_string());
        }
        let long = long.join().unwrap();
        let gave_up = Instant::now();
        let options = shared(TTLS[0]).patience(Patience::For(GAVE_UP_BOUND * 2));
        let next = Held::take(stage, Role::Reader(0), &resource, options, true);
        let took = gave_up.elapsed();
        if next.is_err() || took > GAVE_UP_BOUND {
            let what = format!("the next reader took {took:?} after the last writer gave up");
            breaches.push(what);
        }
        let writers = [short, long].into_iter().filter_map(Result::ok);
        let readers = [beside, next].into_iter().filter_map(Result::ok);
        writers.chain(readers).for_each(|held| held.release(stage));
    });
    first.release(stage);
    if stage.faults.calm_since(began) {
        stage.occurred(Case::WriterGaveUp);
        breaches
            .into_iter()
            .for_each(|what| stage.breach(Case::WriterGaveUp, what));
    }
}

/// The nodes and their proxies, which nodes a fault is hurting, and what
/// the fault threads did.
struct Faults<'a> {
    nodes: &'a Cluster,
    proxies: &'a [Proxy],
    busy: Mutex<Vec<bool>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
    /// How many faults are under way, and the last time one began or
    /// ended (or its effects could still be felt).
    calm: Mutex<(usize, Instant)>,
}

impl Faults<'_> {
    /// Takes `n` nodes nobody else is hurting, or none.
    fn take(&self, n: usize, rng: &mut Rng) -> Vec<usize> {
        let mut busy = self.busy.lock().unwrap();
        let mut free: Vec<usize> = (0..NODES).filter(|&i| !busy[i]).collect();
        if free.len() < n {
            return Vec::new();
        }
        let mut taken = Vec::new();
        for _ in 0..n {
            let i = free.remove(rng.below(free.len() as u64) as usize);
            busy[i] = true;
            taken.push(i);
        }
        taken
    }

    fn give_back(&self, nodes: &[usize]) {
        let mut busy = self.busy.lock().unwrap();
        nodes.iter().for_each(|&i| busy[i] = false);
    }

    /// Whether no fault ran, nor could still be felt, since `since`.
    fn calm_since(&self, since: Instant) -> bool {
        let calm = self.calm.lock().unwrap();
        calm.0 == 0 && calm.1 <= since
    }

    /// A fault begins (`+1`) or ends (`-1`), and is felt until `until`.
    fn stir(&self, change: isize, until: Instant) {
        let mut calm = self.calm.lock().unwrap();
        calm.0 = calm
            .0
            .checked_add_signed(change)
            .expect("a fault ends once");
        calm.1 = calm.1.max(until);
    }

    fn count(&self, class: usize) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry(CLASSES[class].name)
            .or_default() += 1;
    }

    /// One fault of `class` on free nodes, healed before it returns.
    fn once(&self, class: usize, rng: &mut Rng) {
        let fault = CLASSES[class].fault;
        let n = match fault {
            Hurt::LoseMajority => 3,
            Hurt::LoseMinority | Hurt::Pause => 1 + rng.below(2) as usize,
            Hurt::Partition => 1 + rng.below(3) as usize,
            // Often enough a quorum, so that an extension gets no answer in
            // time and its held-up commands land after the lock ended.
            Hurt::DelayPastValidity => 2 + rng.below(2) as usize,
            _ => 1,
        };
        let nodes = self.take(n, rng);
        if nodes.is_empty() {
            return;
        }
        // Each fault lasts less than the shortest TTL or more than the longest.
        let lasts = if rng.below(3) == 0 {
            rng.millis(900, 1500)
        } else {
            rng.millis(10, 250)
        };
        // Commands held up land up to 1.5 s after; a node back from a
        // restart or a pause, or a proxy healed, has the client reconnect.
        let felt = match fault {
            Hurt::DelayPastValidity => QUIET,
            Hurt::Restart | Hurt::RestartPersisted => Duration::from_millis(300),
            _ => Duration::from_millis(100),
        };
        self.stir(1, Instant::now());
        self.hurt(fault, &nodes, lasts, rng);
        self.stir(-1, Instant::now() + felt);
        self.give_back(&nodes);
        self.count(class);
    }

    /// Hurts `nodes` with `fault` for `lasts`, then heals them.
    fn hurt(&self, fault: Hurt, nodes: &[usize], lasts: Duration, rng: &mut Rng) {
        let each = |f: &dyn Fn(usize)| nodes.iter().for_each(|&i| f(i));
        let with = |fault: Fault, lasts: Duration| {
            each(&|i| self.proxies[i].set_fault(fault));
            thread::sleep(lasts);
            each(&|i| self.proxies[i].set_fault(Fault::None));
        };
        let node = |i: usize| self.nodes.node(i);
        match fault {
            Hurt::Restart => {
                each(&|i| node(i).kill().expect("kill"));
                thread::sleep(lasts);
                each(&|i| node(i).start().expect("restart after a kill"));
            }
            Hurt::RestartPersisted => {
                each(&|i| node(i).restart_persisted().expect("restart with its data"))
            }
            Hurt::LoseMinority | Hurt::LoseMajority => {
                each(&|i| node(i).flushall().expect("FLUSHALL"))
            }
            Hurt::Partition => with(Fault::Partition, lasts),
            // Commands read in this short window land long after they left
            // (past a validity); those that follow go at once, on their own
            // connections: reordered.
            Hurt::DelayPastValidity => {
                with(Fault::Delay(rng.millis(900, 1500)), rng.millis(50, 300))
            }
            Hurt::Pause => {
                each(&|i| node(i).pause().expect("pause"));
                thread::sleep(lasts);
                each(&|i| node(i).resume().expect("resume"));
            }
            Hurt::LatencyAndResets if rng.below(2) == 0 => with(Fault::Reset, lasts),
            Hurt::LatencyAndResets => with(Fault::Delay(rng.millis(5, 120)), lasts),
        }
    }
}

/// One fault thread: until `until`, a fault of the class, then a pause.
fn inject(faults: &Faults, class: usize, until: Instant, seed: u64) {
    let mut rng = Rng::new(seed);
    while Instant::now() < until {
        faults.once(class, &mut rng);
        thread::sleep(
            rng.millis(0, 300)
                .min(until.saturating_duration_since(Instant::now())),
        );
    }
}

/// What the oracle found in one class.
#[derive(Debug, Default)]
struct Found {
    holds: usize,
    /// Claims that overlapped as the kind allows: readers, or permits.
    shared: usize,
    overlaps: Vec<String>,
    untold: Vec<String>,
    regressions: Vec<String>,
}

/// The oracle: per class, the conflicts, those whose first holders were
/// not told, and the writers' fencing tokens out of order.
fn judge(log: &[Hold]) -> Vec<Found> {
    let mut found: Vec<Found> = CLASSES.iter().map(|_| Found::default()).collect();
    let mut by_start: Vec<&Hold> = log.iter().collect();
    by_start.sort_by_key(|h| h.start);
    // Sweep by claim start, keeping the claims not over yet.
    let mut open: Vec<&Hold> = Vec::new();
    for &b in &by_start {
        let found = &mut found[b.class];
        found.holds += 1;
        open.retain(|a| a.claim_end > b.start);
        // The claims of b's resource that began first (the sweep goes by start).
        let same = open
            .iter()
            .filter(|a| a.resources.iter().any(|r| b.resources.contains(r)));
        let untold = |a: &&&Hold| !a.told_since(b.start);
        if let Role::Permit(k) = b.role {
            let (k, count) = (k as usize, same.clone().count());
            found.shared += count.min(k - 1);
            if count >= k {
                let seen = format!("{} holders of {k} permits, the last {b:?}", count + 1);
                if same.filter(untold).count() >= k {
                    found.untold.push(seen.clone());
                }
                found.overlaps.push(seen);
            }
        } else {
            for a in same {
                if a.role.is_reader() && b.role.is_reader() {
                    found.shared += 1;
                    continue;
                }
                let seen = format!("{a:?}\n  and {b:?}");
                if untold(&a) {
                    found.untold.push(seen.clone());
                }
                found.overlaps.push(seen);
            }
        }
        open.push(b);
    }
    // One counter: the first resource's.
    by_start.retain(|h| h.role == Role::Fenced && h.resources == [RESOURCES[0]]);
    for pair in by_start.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let asserted = CLASSES[a.class].fencing && CLASSES[b.class].fencing;
        if asserted && a.fence >= b.fence {
            let seen = format!("token {} after {}:\n  {a:?}\n  {b:?}", b.fence, a.fence);
            found[b.class].regressions.push(seen);
        }
    }
    found
}

#[test]
fn no_fault_class_breaks_the_contract_for_locks_guards_or_with_lock() {
    let (run_for, seed) = settings();
    println!("checker: running {run_for:?} with REDLOCK_CHECKER_SEED={seed}");
    let nodes = cluster(NODES);
    let proxies = nodes.proxies().expect("a proxy per node");
    let graces = [Duration::ZERO, RESTART_GRACE];
    let run = Run {
        clients: graces.map(|grace| (0..CLIENTS).map(|_| client(&proxies, grace)).collect()),
        class: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        log: Mutex::new(Vec::new()),
        failures: Mutex::new(BTreeMap::new()),
        cases: Mutex::new(BTreeMap::new()),
        breaches: Mutex::new(Vec::new()),
        episodes: AtomicUsize::new(0),
    };
    // Fresh nodes are kept out by the guard until their uptime passes it.
    let guarded = &run.clients[1][0];
    wait_until(Duration::from_secs(10), "every node votes", || {
        (guarded.try_acquire("warm-up", fenced(TTLS[0])))
            .and_then(|lock| guarded.release(lock))
            .is_ok_and(|report| {
                (report.nodes.iter())
                    .all(|n| !matches!(n.outcome, NodeOutcome::Failed(_) | NodeOutcome::TimedOut))
            })
    });
    let faults = Faults {
        nodes: &nodes,
        proxies: &proxies,
        busy: Mutex::new(vec![false; NODES]),
        counts: Mutex::new(BTreeMap::new()),
        calm: Mutex::new((0, Instant::now())),
    };
    let started = Instant::now();
    thread::scope(|s| {
        for c in 0..CLIENTS {
            for t in 0..THREADS_PER_CLIENT {
                let worker_seed = seed
                    ^ ((c * THREADS_PER_CLIENT + t + 1) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let run = &run;
                s.spawn(move || work(run, (c, t), worker_seed));
            }
        }
        for (k, case) in CASES.into_iter().enumerate() {
            let case_seed = seed ^ ((k + 1) as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let stage_of = Stage {
                run: &run,
                faults: &faults,
                who: (CLIENTS + k, k),
            };
            s.spawn(move || stage(&stage_of, case, case_seed));
        }
        // Each class in turn: its faults, then a quiet end.
        let mut turn = 0u64;
        while started.elapsed() < run_for || turn < CLASSES.len() as u64 {
            let class = (turn % CLASSES.len() as u64) as usize;
            run.class.store(class, Ordering::Relaxed);
            let until = Instant::now() + CLASS_TIME - QUIET;
            thread::scope(|f| {
                for k in 0..2u64 {
                    let fault_seed = seed.rotate_left(17 + 13 * k as u32) ^ (turn * 2 + k + 1);
                    let faults = &faults;
                    f.spawn(move || inject(faults, class, until, fault_seed));
                }
            });
            thread::sleep(QUIET);
            turn += 1;
        }
        run.stop.store(true, Ordering::Relaxed);
    });

    let log = run.log.into_inner().unwrap();
    assert!(log.len() >= 100, "only {} holds in {run_for:?}", log.len());
    let found = judge(&log);
    let counts = faults.counts.into_inner().unwrap();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for hold in &log {
        *kinds.entry(format!("{:?}", hold.holder)).or_default() += 1;
        *kinds.entry(format!("{:?}", hold.role)).or_default() += 1;
        *kinds.entry(format!("client {}", hold.who.0)).or_default() += 1;
    }
    println!(
        "checker: {} holds in {:?} {kinds:?}; failed acquisitions {:?}",
        log.len(),
        started.elapsed(),
        run.failures.into_inner().unwrap()
    );
    for (class, found) in CLASSES.iter().zip(&found) {
        println!(
            "checker: {:<42} {:<9} faults {:>4}, holds {:>5}, shared {:>4}, conflicts {:>3}, untold {}, token regressions {}",
            class.name,
            format!("{:?}", class.cell),
            counts.get(class.name).unwrap_or(&0),
            found.holds,
            found.shared,
            found.overlaps.len(),
            found.untold.len(),
            found.regressions.len()
        );
    }
    let cases = run.cases.into_inner().unwrap();
    let breaches = run.breaches.into_inner().unwrap();
    let mut broken: BTreeMap<Case, usize> = BTreeMap::new();
    breaches
        .iter()
        .for_each(|(case, _)| *broken.entry(*case).or_default() += 1);
    println!("checker: cases {cases:?}; breaches {broken:?}");
    let shared: usize = found.iter().map(|f| f.shared).sum();
    assert!(
        shared > 0,
        "readers and permit holders never overlapped: the kinds do not share"
    );
    // The first two of each case.
    let mut shown: BTreeMap<Case, usize> = BTreeMap::new();
    let first: Vec<&str> = breaches
        .iter()
        .filter(|(case, _)| {
            let n = shown.entry(*case).or_default();
            *n += 1;
            *n <= 2
        })
        .map(|(_, seen)| seen.as_str())
        .collect();
    assert!(
        breaches.is_empty(),
        "{} breaches in the cases (seed {seed}):\n{}",
        breaches.len(),
        first.join("\n")
    );
    for case in CASES {
        let n = cases.get(&case).copied().unwrap_or(0);
        assert!(
            n >= CASE_MINIMUM || run_for < Duration::from_secs(DEFAULT_SECS),
            "{case:?} occurred {n} times, fewer than {CASE_MINIMUM} (seed {seed})"
        );
    }
    for (class, found) in CLASSES.iter().zip(&found) {
        let what = format!("{} (seed {seed})", class.name);
        assert!(found.holds > 0, "{what}: no hold");
        assert!(
            counts.get(class.name).is_some_and(|&n| n > 0),
            "{what}: no fault"
        );
        let first = |v: &[String]| v.iter().take(3).cloned().collect::<Vec<_>>().join("\n");
        assert!(
            found.untold.is_empty(),
            "{what}: {} untold overlaps:\n{}",
            found.untold.len(),
            first(&found.untold)
        );
        assert!(
            class.cell == Cell::Told || found.overlaps.is_empty(),
            "{what}: {} overlaps where the table says exclusive:\n{}",
            found.overlaps.len(),
            first(&found.overlaps)
        );
        assert!(
            found.regressions.is_empty(),
            "{what}: {} token regressions:\n{}",
            found.regressions.len(),
            first(&found.regressions)
        );
    }
}

#[test]
fn the_oracle_finds_overlaps_untold_holders_and_token_regressions_in_a_made_up_log() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let hold = |class: usize, fence: u64, start: u64, claim_end: u64| Hold {
        who: (0, 0),
        role: Role::Fenced,
        resources: vec![RESOURCES[0].to_string()],
        holder: Holder::Lock,
        class,
        fence,
        start: at(start),
        claim_end: at(claim_end),
        oks: Vec::new(),
        held: Vec::new(),
    };
    let class = 5; // partitions: exclusive, fencing asserted
                   // Back to back, then one that starts as the last ends.
    let clean = [
        hold(class, 1, 0, 10),
        hold(class, 2, 10, 30),
        hold(class, 3, 30, 40),
    ];
    let found = judge(&clean);
    assert!(found[class].overlaps.is_empty() && found[class].regressions.is_empty());
    // A claim over two others, and a smaller token after a larger one.
    let overlapping = [
        hold(class, 1, 0, 20),
        hold(class, 3, 5, 8),
        hold(class, 2, 15, 30),
    ];
    let found = judge(&overlapping);
    assert_eq!(found[class].overlaps.len(), 2, "{found:?}");
    assert_eq!(found[class].regressions.len(), 1, "{found:?}");
    // Told: the first holder's calls after the second began all failed.
    let mut first = hold(3, 1, 0, 20);
    first.oks.push(at(2));
    let second = hold(3, 2, 10, 30);
    let found = judge(&[first, second]);
    assert_eq!((found[3].overlaps.len(), found[3].untold.len()), (1, 0));
    // Untold: an extension that started after the second began said Ok.
    let mut first = hold(3, 1, 0, 40);
    first.oks.push(at(12));
    let found = judge(&[first, hold(3, 2, 10, 30)]);
    assert_eq!(found[3].untold.len(), 1, "{found:?}");
    // Untold: a guard still said held past the deadline it had then.
    let mut first = hold(3, 1, 0, 500);
    first.held = vec![(at(5), at(200)), (at(400), at(500))];
    let found = judge(&[first, hold(3, 2, 10, 30)]);
    assert_eq!(found[3].untold.len(), 1, "{found:?}");
    // Readers share; a writer among them conflicts with each.
    let as_role = |role: Role, start: u64, end: u64| Hold {
        role,
        resources: role.resources(),
        ..hold(class, 0, start, end)
    };
    let readers = [
        as_role(Role::Reader(0), 0, 20),
        as_role(Role::Reader(0), 5, 30),
    ];
    let found = judge(&readers);
    assert_eq!((found[class].shared, found[class].overlaps.len()), (1, 0));
    let mut mixed: Vec<Hold> = readers.iter().map(|h| as_role(h.role, 0, 20)).collect();
    mixed.push(as_role(Role::Fenced, 10, 40));
    assert_eq!(judge(&mixed)[class].overlaps.len(), 2);
    // A writer of both resources conflicts with a reader of the second;
    // readers of different resources never meet.
    let apart = [
        as_role(Role::Reader(1), 0, 20),
        as_role(Role::Reader(0), 5, 30),
        as_role(Role::Pair, 10, 40),
    ];
    assert_eq!(
        judge(&apart)[class].overlaps.len(),
        2,
        "{:?}",
        judge(&apart)
    );
    // Two permits: two holders share, a third conflicts; untold only if
    // neither of the first two was told.
    let permits = |third: u64| {
        let (mut first, mut second) = (
            as_role(Role::Permit(2), 0, 50),
            as_role(Role::Permit(2), 5, 50),
        );
        first.oks.push(at(third + 1));
        second.oks.push(at(third + 2));
        vec![first, second, as_role(Role::Permit(2), third, 60)]
    };
    let found = judge(&permits(10));
    assert_eq!((found[class].shared, found[class].overlaps.len()), (2, 1));
    assert_eq!(found[class].untold.len(), 1, "{found:?}");
    let mut told = permits(10);
    told[1].oks.clear();
    assert_eq!(judge(&told)[class].untold.len(), 0);
}
