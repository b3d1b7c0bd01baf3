//! Hand-offs of one contended lock (issue 13), against 5 throwaway local
//! redis-server nodes:
//!
//! ```text
//! cargo bench --bench handoff
//! ```
//!
//! 4 workers loop { acquire one shared resource with the default retry
//! settings, hold it 1 ms, release it, work 5 ms without it }, first
//! sharing one client, then with a client each. Reported: hand-offs per
//! second, the acquire wait's p50 and p99, and the rounds per hand-off
//! (`SET NX` calls one node counted, so every acquisition attempt, divided
//! by the hand-offs). The ceiling is about 650 hand-offs/s (4 workers x one
//! cycle per 6 ms, the lock busy 1 ms per cycle). Set `BENCH_SECONDS` to
//! change how long each case runs (default 3).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use redlock_sync::{LockError, Redlock};
use redlock_sync_testing::Cluster;

const NODES: usize = 5;
const WORKERS: usize = 4;
const TTL: Duration = Duration::from_secs(10);
const HOLD: Duration = Duration::from_millis(1);
const WORK: Duration = Duration::from_millis(5);
const RESOURCE: &str = "handoff";

fn main() {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let phase = Duration::from_secs_f64(seconds);
    let cluster = Cluster::start(NODES).expect("start 5 redis-server nodes");

    println!("# redlock-sync hand-off benchmark: 5 local redis-server nodes, {WORKERS} workers");
    println!("# loop {{ acquire (default retry settings); hold 1 ms; release; work 5 ms }}");
    println!();
    println!("| clients | hand-offs/s | acquire wait p50 | acquire wait p99 | rounds per hand-off | gave up |");
    println!("|---|--:|--:|--:|--:|--:|");
    let shared = Redlock::new(cluster.urls()).expect("client");
    let clients: Vec<Redlock> = vec![shared; WORKERS];
    row("one shared `Redlock`", &cluster, &clients, phase);
    let clients: Vec<Redlock> = (0..WORKERS)
        .map(|_| Redlock::new(cluster.urls()).expect("client"))
        .collect();
    row("one `Redlock` per worker", &cluster, &clients, phase);
}

/// Runs the loop with worker `i` on `clients[i]` for `phase`, and prints a
/// row.
fn row(name: &str, cluster: &Cluster, clients: &[Redlock], phase: Duration) {
    // Warm up: connections open, the subscription line too.
    run(clients, Duration::from_millis(300));
    let sets_before = set_calls(cluster);
    let (handoffs, gave_up, mut waits, took) = run(clients, phase);
    let sets = set_calls(cluster) - sets_before;
    waits.sort_unstable();
    let pct = |p: f64| {
        waits
            .get(((waits.len() as f64 * p) as usize).min(waits.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "| {name} | {:.0} | {:.2} ms | {:.2} ms | {:.2} | {gave_up} |",
        handoffs as f64 / took.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        sets as f64 / handoffs.max(1) as f64,
    );
}

/// The loop on every worker for `phase`: hand-offs, acquisitions that gave
/// up (after the default retries), every acquire's wait, and the time taken.
fn run(clients: &[Redlock], phase: Duration) -> (u64, u64, Vec<Duration>, Duration) {
    let stop = AtomicBool::new(false);
    let handoffs = AtomicU64::new(0);
    let gave_up = AtomicU64::new(0);
    let waits = Mutex::new(Vec::new());
    let start = Barrier::new(clients.len() + 1);
    let took = std::thread::scope(|s| {
        for locks in clients {
            let (stop, handoffs, gave_up, waits, start) =
                (&stop, &handoffs, &gave_up, &waits, &start);
            s.spawn(move || {
                let mut mine = Vec::new();
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    match locks.acquire(RESOURCE, TTL) {
                        Ok(lock) => {
                            mine.push(asked.elapsed());
                            std::thread::sleep(HOLD);
                            locks.release(lock).expect("release");
                            handoffs.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(LockError::Contended { .. }) => {
                            mine.push(asked.elapsed());
                            gave_up.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("acquire: {e}"),
                    }
                    std::thread::sleep(WORK);
                }
                waits.lock().unwrap().extend(mine);
            });
        }
        start.wait();
        let began = Instant::now();
        std::thread::sleep(phase);
        stop.store(true, Ordering::Relaxed);
        began.elapsed()
    });
    (
        handoffs.into_inner(),
        gave_up.into_inner(),
        waits.into_inner().unwrap(),
        took,
    )
}

/// How many `SET` commands the first node ran so far.
fn set_calls(cluster: &Cluster) -> u64 {
    let info = cluster
        .node(0)
        .query(&["INFO", "commandstats"])
        .expect("INFO commandstats");
    let text = match info {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO answered {other:?}"),
    };
    text.lines()
        .find_map(|line| line.strip_prefix("cmdstat_set:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
