//! Worker threads share one list of jobs; each job is guarded by its own
//! lock through `try_with_lock`, so it runs on exactly one worker, even when it
//! runs longer than the lock's TTL (the watchdog extends the lock).
//!
//! Run it with `cargo run --example batch_jobs`. It starts five throwaway
//! local redis-server nodes itself (redis-server must be installed), unless
//! `REDLOCK_NODES` names real ones, comma-separated:
//!
//! ```text
//! REDLOCK_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379 \
//!     cargo run --example batch_jobs
//! ```
//!
//! The pattern: try each job's lock once (`try_with_lock`, one round: if
//! another worker holds it, move on to the next job), check under the lock whether the job is
//! already done (another worker may have finished it between our look and
//! our lock), do the work in steps with `guard.check()?` before each, and
//! record the job as done *under the lock*, after a last `guard.check()?`.
//! Recorded after `try_with_lock` returns, it would come after the release,
//! and another worker could take the lock in between and run the job again.

mod common;

use std::collections::HashSet;
use std::error::Error;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redlock_sync::{LockError, Redlock};

const WORKERS: usize = 4;
const JOBS: usize = 12;
const TTL: Duration = Duration::from_millis(500);
const STEP: Duration = Duration::from_millis(100);

/// How a job went for one worker.
enum Outcome {
    Ran { took: Duration },
    AlreadyDone,
}

fn main() -> ExitCode {
    common::exit_code(run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let (_cluster, urls) = common::nodes(5)?;
    println!("nodes: {}", urls.join(", "));

    // One client for all workers, with the default retries for any lock
    // that should wait; the jobs' locks are tried once (`try_with_lock`):
    // a job whose lock is held is someone else's for now. A cap of 5 s: a
    // hung job cannot block the others for longer.
    let locks = Redlock::builder(&urls)
        .max_hold(Duration::from_secs(5))
        .build()?;
    // Stands in for the results table: the jobs done.
    let done: Mutex<HashSet<usize>> = Mutex::new(HashSet::new());
    let runs = Mutex::new(0);
    let started = Instant::now();

    std::thread::scope(|s| {
        for worker in 0..WORKERS {
            let (locks, done, runs) = (&locks, &done, &runs);
            s.spawn(move || {
                // Each worker starts at another job, and goes round until
                // every job is done.
                while lock(done).len() < JOBS {
                    for i in 0..JOBS {
                        let job = (worker * JOBS / WORKERS + i) % JOBS;
                        if lock(done).contains(&job) {
                            continue;
                        }
                        let resource = format!("batch_jobs:job-{job}");
                        let result = locks.try_with_lock(&resource, TTL, |guard| {
                            if lock(done).contains(&job) {
                                return Ok(Outcome::AlreadyDone);
                            }
                            // Jobs 0, 4, 8 take 9 steps (900 ms, almost
                            // twice the TTL); the others take 1 to 3.
                            let steps = if job.is_multiple_of(4) { 9 } else { 1 + job as u32 % 3 };
                            let begun = Instant::now();
                            for _ in 0..steps {
                                guard.check()?; // stop at once if the lock is lost
                                std::thread::sleep(STEP);
                            }
                            guard.check()?;
                            lock(done).insert(job);
                            Ok(Outcome::Ran {
                                took: begun.elapsed(),
                            })
                        });
                        match result {
                            Ok(Outcome::Ran { took }) => {
                                *lock(runs) += 1;
                                let note = if took > TTL { ", extended by the watchdog" } else { "" };
                                println!(
                                    "worker {worker}: job {job:2} done in {took:.0?} (TTL {TTL:?}{note})"
                                );
                            }
                            Ok(Outcome::AlreadyDone) => {}
                            Err(LockError::Contended { .. }) => {} // another worker has it
                            Err(e) => println!("worker {worker}: job {job:2} not done: {e}"),
                        }
                    }
                }
            });
        }
    });

    let runs = *lock(&runs);
    println!(
        "\n{JOBS} jobs, {runs} runs, by {WORKERS} workers in {:.1?}",
        started.elapsed()
    );
    if runs != JOBS {
        return Err(format!(
            "expected each of the {JOBS} jobs to run exactly once, got {runs} runs"
        )
        .into());
    }
    println!("each job ran exactly once");
    Ok(())
}

/// Locks an in-process mutex, whether or not another thread panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
