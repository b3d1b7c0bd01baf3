//! A randomized safety checker: several clients, each with several threads,
//! contend for one resource with fenced locks while a random schedule of
//! faults hits the nodes: kills with a delayed restart (without
//! persistence), pauses shorter and longer than the TTL, partitions,
//! latency and connection resets, and one rolling restart of every node.
//!
//! Every critical section records its fencing token, its start, its end and
//! its validity deadline(s) in one log. The checker then asserts that no two
//! sections overlapped while both holders still had validity left, and that
//! the fencing tokens increase in the order the sections started.
//!
//! The clients run with the restarted-node guard on (grace above the
//! longest TTL): without it, a node restarted without persistence can hand
//! out a lock that is still held (see tests/restart_guard.rs).
//!
//! It runs for about 40 s. `REDLOCK_CHECKER_SECS=600` runs longer (with
//! `REDLOCK_SYNC_TEST_TIMEOUT=900`, past the harness's time bound), and
//! `REDLOCK_CHECKER_SEED=<u64>` replays a fault schedule (thread timing
//! still varies). Run with `--nocapture` to see the counts.
//! `REDLOCK_CHECKER_GUARD=off` runs the clients without the guard, to see
//! the checker catch the restart hazard (it needs long runs to hit it).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::{cluster, fenced, wait_until};
use redlock_sync::{Lock, LockError, NodeOutcome, Redlock};
use redlock_sync_testing::{Cluster, Fault, Proxy};

const RESOURCE: &str = "checked";
const CLIENTS: usize = 3;
const THREADS_PER_CLIENT: usize = 3;
const NODES: usize = 5;
/// TTLs drawn for acquire and extend.
const TTLS: [Duration; 2] = [Duration::from_millis(300), Duration::from_millis(800)];
/// Above the longest TTL.
const RESTART_GRACE: Duration = Duration::from_secs(1);
const DEFAULT_SECS: u64 = 40;

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

/// One critical section, as its holder saw it.
#[derive(Debug)]
struct Section {
    client: usize,
    thread: usize,
    /// The fencing token; `None` for a section run through `with_lock`.
    token: Option<u64>,
    /// When `acquire_fenced` returned.
    start: Instant,
    /// When the holder stopped working under the lock.
    end: Instant,
    /// The stretches in which the holder knew it had validity left: from
    /// when acquire (or a successful extend) returned to the validity
    /// deadline it gave, cut at `end`.
    valid: Vec<(Instant, Instant)>,
}

/// What the fault threads did.
#[derive(Default)]
struct FaultLog {
    counts: BTreeMap<&'static str, u64>,
}

/// How long to run, the seed, and the restart grace (zero: guard off).
fn settings() -> (Duration, u64, Duration) {
    let secs = std::env::var("REDLOCK_CHECKER_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let seed = std::env::var("REDLOCK_CHECKER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| getrandom::u64().expect("a random seed"));
    let grace = match std::env::var("REDLOCK_CHECKER_GUARD").as_deref() {
        Ok("off") => Duration::ZERO,
        _ => RESTART_GRACE,
    };
    (Duration::from_secs(secs), seed, grace)
}

fn client(proxies: &[Proxy], grace: Duration) -> Redlock {
    Redlock::builder(proxies.iter().map(Proxy::url))
        .retry_count(5)
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(20))
        .io_timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(50))
        .restart_grace(grace)
        .build()
        .expect("valid checker configuration")
}

/// One worker thread: acquire, work (sometimes past the validity, like a
/// holder stuck in a GC pause), sometimes extend, release; until `stop`.
fn work(
    locks: &Redlock,
    who: (usize, usize),
    seed: u64,
    stop: &AtomicBool,
    log: &Mutex<Vec<Section>>,
    failures: &Mutex<BTreeMap<&'static str, u64>>,
) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let ttl = TTLS[rng.below(2) as usize];
        if rng.below(4) == 0 {
            scoped_section(locks, who, ttl, &mut rng, log, failures);
            continue;
        }
        let mut lock: Lock = match locks.acquire(RESOURCE, fenced(ttl)) {
            Ok(lock) => lock,
            Err(e) => {
                let kind = match e {
                    LockError::Contended { .. } => "contended",
                    LockError::NoQuorum { .. } => "no quorum",
                    LockError::TooSlow { .. } => "too slow",
                    other => panic!("acquire_fenced failed unexpectedly: {other}"),
                };
                *failures.lock().unwrap().entry(kind).or_default() += 1;
                continue;
            }
        };
        let start = Instant::now();
        let token = lock.fencing_token().expect("a fenced lock has a token");
        let mut valid = vec![(start, lock.valid_until())];
        // Most sections are short; some hold the lock for most of its TTL
        // and extend it (long holds are what restarts and pauses threaten);
        // a few get stuck past their validity, like a holder in a GC pause.
        let (work, extend) = match rng.below(60) {
            0 => (lock.validity() + rng.millis(1, 100), false),
            1..=4 => (lock.validity().mul_f64(0.6), true),
            10..=19 => (rng.millis(0, 20), true),
            _ => (rng.millis(0, 20), false),
        };
        thread::sleep(work);
        if extend && lock.is_valid() && locks.extend(&mut lock, ttl).is_ok() {
            valid.push((Instant::now(), lock.valid_until()));
            thread::sleep(work.min(lock.validity().mul_f64(0.6)));
        }
        let end = Instant::now();
        let valid = valid
            .into_iter()
            .map(|(from, until)| (from, until.min(end)))
            .filter(|(from, until)| from < until)
            .collect();
        log.lock().unwrap().push(Section {
            client: who.0,
            thread: who.1,
            token: Some(token),
            start,
            end,
            valid,
        });
        let _ = locks.release(lock);
    }
}

/// A critical section through `with_lock`: its watchdog extends the lock
/// while the closure works (sometimes for longer than the TTL). The closure
/// samples the guard's validity as it goes and stops working as soon as the
/// guard says the lock is no longer held; the section is logged either way.
fn scoped_section(
    locks: &Redlock,
    who: (usize, usize),
    ttl: Duration,
    rng: &mut Rng,
    log: &Mutex<Vec<Section>>,
    failures: &Mutex<BTreeMap<&'static str, u64>>,
) {
    let work = if rng.below(5) == 0 {
        ttl.mul_f64(1.5)
    } else {
        rng.millis(0, 20)
    };
    let result = locks.with_lock(RESOURCE, ttl, |guard| {
        let start = Instant::now();
        let mut valid = Vec::new();
        while start.elapsed() < work && guard.is_held() {
            let now = Instant::now();
            valid.push((now, now + guard.validity()));
            thread::sleep(Duration::from_millis(5).min(work.saturating_sub(start.elapsed())));
        }
        let end = Instant::now();
        log.lock().unwrap().push(Section {
            client: who.0,
            thread: who.1,
            token: None,
            start,
            end,
            valid: valid
                .into_iter()
                .map(|(from, until): (Instant, Instant)| (from, until.min(end)))
                .filter(|(from, until)| from < until)
                .collect(),
        });
        Ok::<(), LockError>(())
    });
    let kind = match result {
        Ok(()) => return,
        Err(LockError::Contended { .. }) => "contended",
        Err(LockError::NoQuorum { .. }) => "no quorum",
        Err(LockError::TooSlow { .. }) => "too slow",
        Err(LockError::Lost { .. }) => "with_lock: lost while held",
        Err(other) => panic!("with_lock failed unexpectedly: {other}"),
    };
    *failures.lock().unwrap().entry(kind).or_default() += 1;
}

/// One fault thread: picks a node nobody else is hurting, hurts it for a
/// while, heals it; until `stop`. Healing always completes.
fn inject(
    nodes: &Cluster,
    proxies: &[Proxy],
    busy: &Mutex<Vec<bool>>,
    seed: u64,
    stop: &AtomicBool,
    faults: &Mutex<FaultLog>,
) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(rng.millis(0, 300));
        let i = rng.below(NODES as u64) as usize;
        if std::mem::replace(&mut busy.lock().unwrap()[i], true) {
            continue;
        }
        let (node, proxy) = (nodes.node(i), &proxies[i]);
        // Each fault lasts less than the shortest TTL or more than the longest.
        let long = rng.below(3) == 0;
        let lasts = if long {
            rng.millis(900, 1500)
        } else {
            rng.millis(10, 250)
        };
        let kind = match rng.below(8) {
            0 | 1 => {
                node.kill().expect("kill");
                thread::sleep(lasts);
                node.start().expect("restart after a kill");
                if long {
                    "kill, restart after the TTL"
                } else {
                    "kill, restart within the TTL"
                }
            }
            2 | 3 => {
                node.pause().expect("pause");
                thread::sleep(lasts);
                node.resume().expect("resume");
                if long {
                    "pause longer than the TTL"
                } else {
                    "pause shorter than the TTL"
                }
            }
            other => {
                let (fault, kind) = match other {
                    4 | 5 => (Fault::Partition, "partition"),
                    6 => (Fault::Delay(rng.millis(5, 120)), "latency"),
                    _ => (Fault::Reset, "connection reset"),
                };
                proxy.set_fault(fault);
                thread::sleep(lasts);
                proxy.set_fault(Fault::None);
                kind
            }
        };
        busy.lock().unwrap()[i] = false;
        *faults.lock().unwrap().counts.entry(kind).or_default() += 1;
    }
}

/// A rolling restart, as an upgrade does it: once, `after` the start, every
/// node in turn is killed and started empty on its port, each once the one
/// before it votes again (twice the grace apart; a node another fault
/// thread is hurting is waited for).
fn rolling_restart(
    nodes: &Cluster,
    busy: &Mutex<Vec<bool>>,
    after: Duration,
    grace: Duration,
    faults: &Mutex<FaultLog>,
) {
    thread::sleep(after);
    for (i, node) in nodes.nodes().iter().enumerate() {
        wait_until(
            Duration::from_secs(5),
            "the node is free to restart",
            || !std::mem::replace(&mut busy.lock().unwrap()[i], true),
        );
        node.restart().expect("restart");
        thread::sleep((grace * 2).max(Duration::from_millis(500)));
        busy.lock().unwrap()[i] = false;
    }
    *faults
        .lock()
        .unwrap()
        .counts
        .entry("rolling restart")
        .or_default() += 1;
}

/// Pairs of sections that held the lock at the same time while both had
/// validity left.
fn overlaps(log: &[Section]) -> Vec<String> {
    // Each section's stretches, merged, so that one section's stretches
    // are disjoint and any overlap is between two sections.
    let mut windows: Vec<(Instant, Instant, usize)> = Vec::new();
    for (i, section) in log.iter().enumerate() {
        let mut own = section.valid.clone();
        own.sort();
        let mut merged: Vec<(Instant, Instant)> = Vec::new();
        for (from, until) in own {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(until),
                _ => merged.push((from, until)),
            }
        }
        windows.extend(merged.into_iter().map(|(from, until)| (from, until, i)));
    }
    windows.sort_by_key(|w| w.0);
    let mut found = Vec::new();
    let mut latest: Option<(Instant, usize)> = None;
    for (from, until, i) in windows {
        match latest {
            Some((end, j)) if from < end => {
                found.push(format!(
                    "{:?} and {:?} both had validity left for {:?}",
                    log[j],
                    log[i],
                    end.min(until) - from
                ));
                if until > end {
                    latest = Some((until, i));
                }
            }
            Some((end, _)) if until <= end => {}
            _ => latest = Some((until, i)),
        }
    }
    found
}

/// Places where the fencing tokens, in the order the sections started, do
/// not strictly increase.
fn token_regressions(log: &[Section]) -> Vec<String> {
    let mut by_start: Vec<&Section> = log.iter().filter(|s| s.token.is_some()).collect();
    by_start.sort_by_key(|s| s.start);
    by_start
        .windows(2)
        .filter(|pair| pair[0].token >= pair[1].token)
        .map(|pair| {
            format!(
                "token {:?} (client {}, thread {}) started after token {:?} (client {}, thread {})",
                pair[1].token,
                pair[1].client,
                pair[1].thread,
                pair[0].token,
                pair[0].client,
                pair[0].thread
            )
        })
        .collect()
}

#[test]
fn sections_never_overlap_with_validity_left_and_fencing_tokens_increase_under_random_faults() {
    let (run_for, seed, grace) = settings();
    println!(
        "checker: running {run_for:?} with REDLOCK_CHECKER_SEED={seed}, restart grace {grace:?}"
    );
    let nodes = cluster(NODES);
    let proxies = nodes.proxies().expect("a proxy per node");
    let clients: Vec<Redlock> = (0..CLIENTS).map(|_| client(&proxies, grace)).collect();
    // Fresh nodes are kept out by the guard until their uptime passes it.
    // A node the guard keeps out fails when it connects, before any reply
    // is read, so it shows as failed in every report until it votes.
    wait_until(Duration::from_secs(10), "every node votes", || {
        clients[0]
            .try_acquire("warm-up", fenced(TTLS[0]))
            .and_then(|lock| clients[0].release(lock))
            .is_ok_and(|report| {
                report
                    .nodes
                    .iter()
                    .all(|n| !matches!(n.outcome, NodeOutcome::Failed(_) | NodeOutcome::TimedOut))
            })
    });

    let stop_work = AtomicBool::new(false);
    let stop_faults = AtomicBool::new(false);
    let log = Mutex::new(Vec::new());
    let failures = Mutex::new(BTreeMap::new());
    let faults = Mutex::new(FaultLog::default());
    let busy = Mutex::new(vec![false; NODES]);
    thread::scope(|s| {
        for (c, locks) in clients.iter().enumerate() {
            for t in 0..THREADS_PER_CLIENT {
                let (log, stop, failures) = (&log, &stop_work, &failures);
                let worker_seed = seed
                    ^ ((c * THREADS_PER_CLIENT + t + 1) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                s.spawn(move || work(locks, (c, t), worker_seed, stop, log, failures));
            }
        }
        for f in 0..2u64 {
            let (nodes, proxies, busy, stop, faults) =
                (&nodes, &proxies, &busy, &stop_faults, &faults);
            let fault_seed = seed.rotate_left(17 + 13 * f as u32) ^ f;
            s.spawn(move || inject(nodes, proxies, busy, fault_seed, stop, faults));
        }
        let (nodes, busy, faults) = (&nodes, &busy, &faults);
        s.spawn(move || rolling_restart(nodes, busy, run_for / 4, grace, faults));
        thread::sleep(run_for);
        // Faults stop first (and heal), then the workers.
        stop_faults.store(true, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(1600));
        stop_work.store(true, Ordering::Relaxed);
    });

    let log = log.into_inner().unwrap();
    let faults = faults.into_inner().unwrap();
    let failures = failures.into_inner().unwrap();
    let overlapping = overlaps(&log);
    let regressions = token_regressions(&log);
    let injected: u64 = faults.counts.values().sum();
    let per_client: Vec<usize> = (0..CLIENTS)
        .map(|c| log.iter().filter(|s| s.client == c).count())
        .collect();
    let past_validity = log
        .iter()
        .filter(|s| s.valid.last().is_none_or(|&(_, until)| until < s.end))
        .count();
    let scoped = log.iter().filter(|s| s.token.is_none()).count();
    println!(
        "checker: {} sections ({scoped} through with_lock; per client {per_client:?}; {past_validity} ran past their validity), failed acquisitions {failures:?}, {injected} faults injected {:?}, violations: {} overlaps, {} token regressions",
        log.len(),
        faults.counts,
        overlapping.len(),
        regressions.len()
    );
    assert!(
        log.len() >= 50,
        "expected at least 50 critical sections in {run_for:?}, got {}",
        log.len()
    );
    assert!(
        injected >= 10,
        "expected at least 10 faults, got {injected}"
    );
    assert_eq!(
        faults.counts.get("rolling restart"),
        Some(&1),
        "{:?}",
        faults.counts
    );
    assert!(
        overlapping.is_empty() && regressions.is_empty(),
        "expected 0 violations (seed {seed}), got {} overlaps and {} token regressions; first ones:\n{}\n{}",
        overlapping.len(),
        regressions.len(),
        overlapping.iter().take(5).cloned().collect::<Vec<_>>().join("\n"),
        regressions.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_checks_find_overlapping_validity_and_token_regressions_in_a_made_up_log() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let section = |token: u64, start: u64, end: u64, valid: &[(u64, u64)]| Section {
        client: 0,
        thread: 0,
        token: Some(token),
        start: at(start),
        end: at(end),
        valid: valid
            .iter()
            .map(|&(from, until)| (at(from), at(until)))
            .collect(),
    };
    // Back to back; a section extended (its two stretches overlap) and then
    // stuck past its validity while the next one starts.
    let clean = [
        section(1, 0, 10, &[(0, 10)]),
        section(2, 10, 80, &[(10, 25), (20, 30)]),
        section(3, 30, 40, &[(30, 40)]),
    ];
    assert_eq!(overlaps(&clean), Vec::<String>::new());
    assert_eq!(token_regressions(&clean), Vec::<String>::new());

    let overlapping = [
        section(1, 0, 20, &[(0, 20)]),
        section(2, 5, 8, &[(5, 8)]),
        section(3, 15, 30, &[(15, 30)]),
    ];
    assert_eq!(
        overlaps(&overlapping).len(),
        2,
        "{:?}",
        overlaps(&overlapping)
    );
    let regressing = [
        section(5, 0, 10, &[(0, 10)]),
        section(5, 10, 20, &[(10, 20)]),
        section(4, 20, 30, &[(20, 30)]),
    ];
    assert_eq!(token_regressions(&regressing).len(), 2);
}
