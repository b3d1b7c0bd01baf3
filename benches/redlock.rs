//! Figures for docs/performance.md, all measured in one run
//! against 5 throwaway local redis-server nodes:
//!
//! ```text
//! cargo bench --bench redlock
//! ```
//!
//! Every figure is compared with a floor measured in the same run: bare
//! sockets that write `SET key token NX PX ttl` to all 5 nodes and then read
//! all 5 replies, then the same for the release script (EVALSHA), with one
//! connection per node per thread and no library logic. Beside it, for
//! several threads, a "perfect batching" reference: one thread writes every
//! thread's commands to each node in one write and reads all the replies,
//! the others only wake per round, to show the most batching could save.
//! Per pair it reports CPU (this process and the 5 servers), the working
//! threads' context switches (from /proc/thread-self/status) and the crate's
//! socket writes and reads (counted by the crate itself, in the hidden
//! `redlock_sync::io_counts`: the process's own accounting in /proc/self/io
//! misses `send` and `recv`, which the standard library's sockets use), how often the servers' main threads fell asleep (each sleep
//! costs a server a wake-up: their CPU follows it), and the load average
//! before and after: compare ratios within one run, and run again when the
//! load says other work shared the cores.
//! Set `BENCH_SECONDS` to change how long each throughput phase runs
//! (default 1; 6 thread counts x 3 alternating runs of 3 phases), and
//! `BENCH_THREADS` (say 16) to measure one thread count alone.

// The examples' error report (message and causes), shared rather than
// copied; the benchmark does not use their node list.
#[allow(dead_code)]
#[path = "../examples/common/mod.rs"]
mod common;

use std::error::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use redlock_sync::{io_counts, IoCounts, LockError, Redlock};
use redlock_sync_testing::{Cluster, Fault, Proxy};

const TTL: Duration = Duration::from_secs(10);
const NODES: usize = 5;
/// The thread counts of the throughput table.
const THREADS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// The crate's release script, for the floor: the same text, so the same
/// SHA1 and the same work on the nodes.
const RELEASE: &str = redlock_sync::RELEASE_SCRIPT;

fn main() -> ExitCode {
    common::exit_code(run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let phase = Duration::from_secs_f64(seconds);
    let cluster = Cluster::start(NODES)?;
    let addrs: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| u.trim_start_matches("redis://").to_string())
        .collect();
    let locks = Redlock::builder(cluster.urls())
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .build()?;

    println!(
        "# redlock-sync benchmark: 5 local redis-server nodes, TTL 10 s, acquire + release pairs"
    );
    println!("machine: {} cores, {}", cores(), cpu_model());
    println!("load average at the start: {}", load_average());
    println!();

    // b. Latency on one thread.
    let mut floor_conn = Floor::connect(&addrs);
    let floor_lat = latencies(|i| floor_pair(&mut floor_conn, i), 5_000);
    let ours_lat = latencies(
        |i| {
            let lock = locks
                .try_acquire(format!("lat:{}", i % 64), TTL)
                .or_panic("uncontended acquire");
            locks.release(lock).or_panic("release");
        },
        5_000,
    );
    println!("## one thread, try_acquire + release");
    println!();
    println!("| | p50 | p99 | p50 ratio to floor |");
    println!("|---|--:|--:|--:|");
    println!(
        "| floor (bare sockets) | {} | {} | 1.00 |",
        us(floor_lat.p50),
        us(floor_lat.p99)
    );
    println!(
        "| redlock-sync | {} | {} | {:.2} |",
        us(ours_lat.p50),
        us(ours_lat.p99),
        ours_lat.p50.as_secs_f64() / floor_lat.p50.as_secs_f64()
    );
    println!();

    // c. Throughput over threads, distinct resources. The floor and the
    // client run in turn, three times each, and the medians are reported,
    // so that a passing disturbance of the machine hits both alike.
    let servers: Vec<u32> = cluster.nodes().iter().filter_map(|n| n.pid()).collect();
    // BENCH_THREADS=16 (say) measures that count alone: for profiling.
    let only: Option<usize> = std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok());
    let mut rows = Vec::new();
    for threads in THREADS.into_iter().filter(|t| only.is_none_or(|o| o == *t)) {
        let mut floor_runs = Vec::new();
        let mut our_runs = Vec::new();
        let mut batched_runs = Vec::new();
        for _ in 0..3 {
            if threads > 1 {
                batched_runs.push(batched_throughput(threads, phase, &servers, &addrs));
            }
            floor_runs.push(throughput(threads, phase, &servers, |t| {
                let mut conn = Floor::connect(&addrs);
                move |i| floor_pair(&mut conn, t * 1_000_000 + i)
            }));
            our_runs.push(throughput(threads, phase, &servers, |t| {
                let locks = &locks;
                move |i| {
                    let lock = locks
                        .try_acquire(format!("tp:{t}:{}", i % 64), TTL)
                        .or_panic("uncontended acquire");
                    locks.release(lock).or_panic("release");
                }
            }));
        }
        let batched = (!batched_runs.is_empty()).then(|| median(batched_runs));
        rows.push((threads, median(floor_runs), median(our_runs), batched));
    }
    println!("## pairs per second, distinct resources per thread (median of 3 alternating runs)");
    println!();
    println!("| threads | floor pairs/s | redlock-sync pairs/s | ratio | perfect batching (reference) ratio |");
    println!("|--:|--:|--:|--:|--:|");
    for (threads, floor, ours, batched) in &rows {
        println!(
            "| {threads} | {:.0} | {:.0} | {:.2} | {} |",
            floor.per_second,
            ours.per_second,
            ours.per_second / floor.per_second,
            batched.as_ref().map_or("".to_string(), |b| format!(
                "{:.2}",
                b.per_second / floor.per_second
            )),
        );
    }
    println!();
    println!("## cost per pair in the same runs: CPU (client + servers), the client's context switches (voluntary + involuntary), the crate's socket writes + reads, the servers' sleeps (floor / redlock-sync / reference)");
    println!();
    println!("| threads | CPU floor | CPU redlock-sync | CPU reference | switches floor | switches redlock-sync | switches reference | redlock-sync writes + reads | server sleeps |");
    println!("|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for (threads, floor, ours, batched) in &rows {
        println!(
            "| {threads} | {} | {} | {} | {} | {} | {} | {:.2} + {:.2} | {:.2} / {:.2} / {} |",
            floor.cpu(),
            ours.cpu(),
            batched.as_ref().map_or(String::new(), Throughput::cpu),
            floor.switches(),
            ours.switches(),
            batched.as_ref().map_or(String::new(), Throughput::switches),
            ours.writes_per_op,
            ours.reads_per_op,
            floor.server_sleeps_per_op,
            ours.server_sleeps_per_op,
            batched
                .as_ref()
                .map_or(String::new(), |b| format!("{:.2}", b.server_sleeps_per_op)),
        );
    }
    println!();

    // d. One contended resource, 4 threads, one try each.
    let acquired = AtomicU64::new(0);
    let contended = throughput(4, phase, &servers, |_| {
        let (locks, acquired) = (&locks, &acquired);
        move |_| match locks.try_acquire("contended", TTL) {
            Ok(lock) => {
                acquired.fetch_add(1, Ordering::Relaxed);
                locks.release(lock).or_panic("release");
            }
            Err(LockError::Contended { .. }) => {}
            Err(e) => panic!("unexpected error under contention: {}", common::Chain(&e)),
        }
    });
    let secs = contended.elapsed.as_secs_f64();
    println!("## one contended resource, 4 threads, try once each");
    println!();
    println!("| attempts/s | acquisitions/s | CPU/attempt |");
    println!("|--:|--:|--:|");
    println!(
        "| {:.0} | {:.0} | {} |",
        contended.per_second,
        acquired.load(Ordering::Relaxed) as f64 / secs,
        us(contended.cpu_per_op)
    );
    println!();

    // e. Behind a proxy that delays each direction by 1 ms.
    let proxies: Vec<Proxy> = cluster.proxies()?;
    for proxy in &proxies {
        proxy.set_fault(Fault::Delay(Duration::from_millis(1)));
    }
    let proxied: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let slow_locks = Redlock::builder(proxies.iter().map(Proxy::url))
        .io_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()?;
    let mut sequential = Floor::connect(&proxied);
    let seq_lat = latencies(|i| sequential_pair(&mut sequential, i), 100);
    let delayed_lat = latencies(
        |i| {
            let lock = slow_locks
                .try_acquire(format!("delay:{}", i % 8), TTL)
                .or_panic("acquire behind the proxy");
            slow_locks.release(lock).or_panic("release");
        },
        100,
    );
    println!("## behind a 1 ms-each-way delay proxy (one round trip = 2 ms)");
    println!();
    println!("| | p50 | round trips | speed-up |");
    println!("|---|--:|--:|--:|");
    println!(
        "| sequential loop over the nodes | {} | {:.1} | 1.0 |",
        us(seq_lat.p50),
        seq_lat.p50.as_secs_f64() / 0.002
    );
    println!(
        "| redlock-sync | {} | {:.1} | {:.1} |",
        us(delayed_lat.p50),
        delayed_lat.p50.as_secs_f64() / 0.002,
        seq_lat.p50.as_secs_f64() / delayed_lat.p50.as_secs_f64()
    );
    println!();
    println!("load average at the end: {}", load_average());
    Ok(())
}

/// `expect` that shows the error's message and causes, not its `Debug`
/// form. A measurement that fails mid-run has no caller to hand the error
/// to; the panic unwinds, so the cluster still stops its servers.
trait OrPanic<T> {
    fn or_panic(self, what: &str) -> T;
}

impl<T, E: Error> OrPanic<T> for Result<T, E> {
    #[track_caller]
    fn or_panic(self, what: &str) -> T {
        match self {
            Ok(value) => value,
            Err(e) => panic!("{what}: {}", common::Chain(&e)),
        }
    }
}

/// One connection per node, speaking raw RESP.
struct Floor {
    conns: Vec<TcpStream>,
    buf: Vec<u8>,
    sha: String,
}

impl Floor {
    fn connect(addrs: &[String]) -> Floor {
        let mut floor = Floor {
            conns: addrs
                .iter()
                .map(|a| {
                    let s = TcpStream::connect(a).or_panic("connect");
                    s.set_nodelay(true).or_panic("nodelay");
                    s
                })
                .collect(),
            buf: Vec::with_capacity(256),
            sha: String::new(),
        };
        let load = pack(&["SCRIPT", "LOAD", RELEASE]);
        for i in 0..floor.conns.len() {
            floor.conns[i].write_all(&load).or_panic("write");
            let reply = floor.read_reply(i);
            floor.sha = String::from_utf8_lossy(&reply)
                .lines()
                .nth(1)
                .unwrap_or_default()
                .to_string();
        }
        floor
    }

    /// Reads `count` one-line replies (`+OK`, `:1`), expecting no others.
    fn read_replies(&mut self, i: usize, count: usize) {
        self.buf.clear();
        let mut chunk = [0u8; 1024];
        while self.buf.iter().filter(|&&b| b == b'\n').count() < count {
            let n = self.conns[i].read(&mut chunk).or_panic("read");
            assert!(n > 0, "node closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
        assert!(
            self.buf.starts_with(b"+OK") || self.buf.starts_with(b":1"),
            "unexpected reply {:?}",
            String::from_utf8_lossy(&self.buf)
        );
    }

    /// Reads one reply (simple string, integer, nil or a short bulk).
    fn read_reply(&mut self, i: usize) -> Vec<u8> {
        self.buf.clear();
        let mut chunk = [0u8; 256];
        loop {
            if complete(&self.buf) {
                return self.buf.clone();
            }
            let n = self.conns[i].read(&mut chunk).or_panic("read");
            assert!(n > 0, "node closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Whether `buf` holds one whole reply of the kinds the floor reads.
fn complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    if buf[0] == b'$' {
        let len: i64 = std::str::from_utf8(&buf[1..end])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1);
        len < 0 || buf.len() >= end + 2 + len as usize + 2
    } else {
        true
    }
}

fn pack(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Write all, read all: SET NX PX, then the release script.
fn floor_pair(floor: &mut Floor, i: usize) {
    let key = format!("floor:{}", i % 64);
    let token = format!("{:040x}", i);
    let set = pack(&["SET", &key, &token, "NX", "PX", "10000"]);
    let release = pack(&["EVALSHA", &floor.sha, "2", &key, &key, &token]);
    for cmd in [&set, &release] {
        for conn in &mut floor.conns {
            conn.write_all(cmd).or_panic("write");
        }
        for n in 0..floor.conns.len() {
            floor.read_reply(n);
        }
    }
}

/// One node after another: SET then read, for each; then release likewise.
fn sequential_pair(floor: &mut Floor, i: usize) {
    let key = format!("seq:{}", i % 64);
    let token = format!("{:040x}", i);
    let set = pack(&["SET", &key, &token, "NX", "PX", "10000"]);
    let release = pack(&["EVALSHA", &floor.sha, "2", &key, &key, &token]);
    for cmd in [&set, &release] {
        for n in 0..floor.conns.len() {
            floor.conns[n].write_all(cmd).or_panic("write");
            floor.read_reply(n);
        }
    }
}

struct Latency {
    p50: Duration,
    p99: Duration,
}

/// Runs `op` `count` times (after a tenth as many for warm-up) and returns
/// the percentiles.
fn latencies(mut op: impl FnMut(usize), count: usize) -> Latency {
    for i in 0..count / 10 {
        op(i);
    }
    let mut samples: Vec<Duration> = (0..count)
        .map(|i| {
            let start = Instant::now();
            op(i);
            start.elapsed()
        })
        .collect();
    samples.sort();
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Latency {
        p50: at(0.50),
        p99: at(0.99),
    }
}

struct Throughput {
    per_second: f64,
    /// This process's CPU time per operation.
    cpu_per_op: Duration,
    /// The redis-server processes' CPU time per operation.
    server_cpu_per_op: Duration,
    /// How often the servers' main threads fell asleep (to wait for a
    /// command) per operation: each time, a write must wake one again.
    server_sleeps_per_op: f64,
    /// Context switches of the working threads per operation.
    voluntary_per_op: f64,
    involuntary_per_op: f64,
    /// The crate's socket syscalls per operation.
    writes_per_op: f64,
    reads_per_op: f64,
    elapsed: Duration,
}

impl Throughput {
    fn cpu(&self) -> String {
        format!("{} + {}", us(self.cpu_per_op), us(self.server_cpu_per_op))
    }

    fn switches(&self) -> String {
        format!(
            "{:.2} + {:.2}",
            self.voluntary_per_op, self.involuntary_per_op
        )
    }
}

/// The run with the median rate.
fn median(mut runs: Vec<Throughput>) -> Throughput {
    runs.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
    runs.swap_remove(runs.len() / 2)
}

/// Runs `threads` threads, each doing the operation `make(thread)` returns in
/// a loop for `phase`, and counts operations, this process's CPU time and
/// that of the `servers` (pids).
fn throughput<'a, F, Op>(threads: usize, phase: Duration, servers: &[u32], make: F) -> Throughput
where
    F: Fn(usize) -> Op + Sync + 'a,
    Op: FnMut(usize),
{
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start_line = Barrier::new(threads + 1);
    let switches = Switches::default();
    let meter = std::thread::scope(|s| {
        for t in 0..threads {
            let (make, done, stop, start_line) = (&make, &done, &stop, &start_line);
            let switches = &switches;
            s.spawn(move || {
                let mut op = make(t);
                for i in 0..100 {
                    op(i);
                }
                start_line.wait();
                let before = thread_switches();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    op(i);
                    i += 1;
                }
                switches.add_since(before);
                done.fetch_add(i as u64, Ordering::Relaxed);
            });
        }
        start_line.wait();
        let meter = Meter::start(servers);
        std::thread::sleep(phase);
        stop.store(true, Ordering::Relaxed);
        meter
    });
    meter.finish(done.load(Ordering::Relaxed), &switches)
}

/// The reference for what batching could gain: `threads` threads, of which
/// one does all the I/O. It writes every thread's `SET` to each node in one
/// write, reads all their replies, wakes the others (as if handing each its
/// reply), then does the same for the release script. No library logic, no
/// early decision: the most that sharing connections and batching commands
/// can save here, in syscalls, wake-ups and server work.
fn batched_throughput(
    threads: usize,
    phase: Duration,
    servers: &[u32],
    addrs: &[String],
) -> Throughput {
    // Rounds done so far; the others sleep until it moves (or the run ends).
    let rounds = std::sync::Mutex::new(0u64);
    let moved = std::sync::Condvar::new();
    let finished = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let switches = Switches::default();
    let mut batch = Floor::connect(addrs);
    let mut meter = None;
    let mut pairs = 0u64;
    std::thread::scope(|s| {
        for _ in 1..threads {
            let (rounds, moved, finished) = (&rounds, &moved, &finished);
            let (started, switches) = (&started, &switches);
            s.spawn(move || {
                let mut seen = 0;
                let mut before = None;
                let mut now = rounds.lock().unwrap();
                while !finished.load(Ordering::Relaxed) {
                    if before.is_none() && started.load(Ordering::Relaxed) {
                        before = Some(thread_switches());
                    }
                    if *now == seen {
                        now = moved.wait(now).unwrap();
                    }
                    seen = *now;
                }
                if let Some(before) = before {
                    switches.add_since(before);
                }
            });
        }
        let round_done = || {
            *rounds.lock().unwrap() += 1;
            moved.notify_all();
        };
        for i in 0..100 {
            batched_pair(&mut batch, threads, i, &round_done);
        }
        meter = Some(Meter::start(servers));
        started.store(true, Ordering::Relaxed);
        let before = thread_switches();
        let start = Instant::now();
        while start.elapsed() < phase {
            batched_pair(&mut batch, threads, pairs as usize, &round_done);
            pairs += 1;
        }
        switches.add_since(before);
        finished.store(true, Ordering::Relaxed);
        round_done();
    });
    meter
        .expect("started")
        .finish(pairs * threads as u64, &switches)
}

/// One pair for each of `threads` threads, batched: see
/// [`batched_throughput`].
fn batched_pair(floor: &mut Floor, threads: usize, i: usize, round_done: &impl Fn()) {
    let (mut set, mut release) = (Vec::new(), Vec::new());
    for t in 0..threads {
        let key = format!("batched:{t}:{}", i % 64);
        let token = format!("{:040x}", i);
        set.extend(pack(&["SET", &key, &token, "NX", "PX", "10000"]));
        release.extend(pack(&["EVALSHA", &floor.sha, "2", &key, &key, &token]));
    }
    for cmd in [&set, &release] {
        for conn in &mut floor.conns {
            conn.write_all(cmd).or_panic("write");
        }
        for n in 0..floor.conns.len() {
            floor.read_replies(n, threads);
        }
        round_done();
    }
}

/// CPU time and wall time from a starting point on.
struct Meter {
    start: Instant,
    cpu: Duration,
    servers: Vec<u32>,
    server_cpu: Duration,
    server_sleeps: u64,
    io: IoCounts,
}

impl Meter {
    fn start(servers: &[u32]) -> Meter {
        Meter {
            start: Instant::now(),
            cpu: cpu_time("self"),
            servers: servers.to_vec(),
            server_cpu: servers.iter().map(|p| cpu_time(&p.to_string())).sum(),
            server_sleeps: servers.iter().map(|&p| server_sleeps(p)).sum(),
            io: io_counts(),
        }
    }

    /// The rates for `ops` operations since the start. (Threads finish
    /// their last operation after the phase ends; their CPU counts in.)
    fn finish(self, ops: u64, switches: &Switches) -> Throughput {
        let elapsed = self.start.elapsed();
        let server: Duration = self.servers.iter().map(|p| cpu_time(&p.to_string())).sum();
        let io = io_counts();
        let ops = ops.max(1);
        let per_op = |n: u64| n as f64 / ops as f64;
        Throughput {
            per_second: ops as f64 / elapsed.as_secs_f64(),
            cpu_per_op: cpu_time("self").saturating_sub(self.cpu) / ops as u32,
            server_cpu_per_op: server.saturating_sub(self.server_cpu) / ops as u32,
            server_sleeps_per_op: per_op(
                self.servers
                    .iter()
                    .map(|&p| server_sleeps(p))
                    .sum::<u64>()
                    .saturating_sub(self.server_sleeps),
            ),
            voluntary_per_op: per_op(switches.voluntary.load(Ordering::Relaxed)),
            involuntary_per_op: per_op(switches.involuntary.load(Ordering::Relaxed)),
            writes_per_op: per_op(io.writes - self.io.writes),
            reads_per_op: per_op(io.reads - self.io.reads),
            elapsed,
        }
    }
}

/// Context switches of the measured threads, summed as each thread ends
/// (a thread's counts vanish with it, so each adds its own).
#[derive(Default)]
struct Switches {
    voluntary: AtomicU64,
    involuntary: AtomicU64,
}

impl Switches {
    fn add_since(&self, before: (u64, u64)) {
        let now = thread_switches();
        self.voluntary
            .fetch_add(now.0.saturating_sub(before.0), Ordering::Relaxed);
        self.involuntary
            .fetch_add(now.1.saturating_sub(before.1), Ordering::Relaxed);
    }
}

/// This thread's voluntary and involuntary context switches so far, from
/// /proc/thread-self/status.
fn thread_switches() -> (u64, u64) {
    switches("/proc/thread-self/status")
}

/// The voluntary and involuntary context switches in a /proc status file
/// (of a thread, or of a process's main thread).
fn switches(path: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(path).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        field("voluntary_ctxt_switches:"),
        field("nonvoluntary_ctxt_switches:"),
    )
}

/// The 1, 5 and 15 minute load averages: a run with a high one was
/// disturbed by other work on the machine.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The voluntary context switches of a server's main thread (the one
/// that serves commands): how often it fell asleep to wait for them.
fn server_sleeps(pid: u32) -> u64 {
    switches(&format!("/proc/{pid}/status")).0
}

/// A process's user + system CPU time, from /proc/<pid>/stat.
fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the file; 12 and 13 after the name and state.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    Duration::from_millis(ticks * 10)
}

fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".to_string())
}
