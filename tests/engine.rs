//! The wake-up hints' line under failures: what a waiting client costs
//! while it cannot listen, or listens again after a backoff.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{cluster, listeners, wait_until};
use redlock_sync::{Lock, Redlock, RetryPolicy};
use redlock_sync_testing::Cluster;

const TTL: Duration = Duration::from_secs(10);

/// How many connections node `i` accepted so far (this query's included).
fn connections(nodes: &Cluster, i: usize) -> u64 {
    let info = match nodes.node(i).query(&["INFO", "stats"]) {
        Ok(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(redis::Value::VerbatimString { text, .. }) => text,
        other => panic!("INFO stats: {other:?}"),
    };
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has total_connections_received")
}

/// The CPU time this process used so far (user + system).
#[cfg(target_os = "linux")]
fn cpu_used() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("(comm)") + 2..]
        .split(' ')
        .collect();
    // utime and stime (fields 14 and 15), in clock ticks: 100 a second.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// Takes `resource` on `locks`, trying for up to 5 s (a node just
/// restarted may refuse a moment).
fn take(locks: &Redlock, resource: &str) -> Lock {
    let started = Instant::now();
    loop {
        match locks.try_acquire(resource, TTL) {
            Ok(lock) => return lock,
            Err(e) if started.elapsed() > Duration::from_secs(5) => {
                panic!("could not take {resource}: {e}")
            }
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn waiting_threads_do_not_spin_once_the_line_is_back_after_a_backoff() {
    let nodes = cluster(1);
    let holder = Redlock::new(nodes.urls()).unwrap();
    let held = take(&holder, "spin");
    let locks = Redlock::builder(nodes.urls())
        .retry_policy(
            RetryPolicy::default()
                .retries(20)
                .delay(Duration::from_secs(10))
                .jitter(Duration::ZERO),
        )
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let locks = locks.clone();
            thread::spawn(move || {
                let lock = locks.acquire("spin", TTL).expect("acquired once released");
                locks.release(lock).unwrap();
            })
        })
        .collect();
    wait_until(Duration::from_secs(5), "the waiters listen", || {
        listeners(&nodes, 0, "spin") > 0
    });
    // The only node fails the line: every node failed in a row, so the
    // waiters back off before they listen again. The node forgot the lock:
    // the holder takes it again at once.
    nodes.node(0).restart().unwrap();
    drop(held);
    let held = take(&holder, "spin");
    wait_until(Duration::from_secs(5), "the waiters listen again", || {
        listeners(&nodes, 0, "spin") > 0
    });
    // The attempts the new subscription set off are over by then.
    thread::sleep(Duration::from_millis(800));
    let before = cpu_used();
    thread::sleep(Duration::from_secs(2));
    let used = cpu_used() - before;
    holder.release(held).unwrap();
    for waiter in waiters {
        waiter.join().unwrap();
    }
    assert!(
        used < Duration::from_millis(150),
        "4 threads waiting on a line back up used {used:?} of CPU in 2 s"
    );
}

#[test]
fn a_user_without_channel_permissions_tries_to_listen_less_and_less_often() {
    let nodes = cluster(1);
    let deaf = common::deaf_url(nodes.node(0));
    let holder = Redlock::new(nodes.urls()).unwrap();
    let held = take(&holder, "acl");
    let locks = Redlock::builder([deaf])
        .retry_policy(
            RetryPolicy::default()
                .retries(1_000)
                .delay(Duration::from_millis(200))
                .jitter(Duration::ZERO),
        )
        .max_wait(Duration::from_millis(6_500))
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    // Its shared connection, opened before counting.
    let other = take(&locks, "acl-other");
    locks.release(other).unwrap();
    let before = connections(&nodes, 0);
    let result = locks.acquire("acl", TTL);
    let line_connects = connections(&nodes, 0) - before - 1;
    holder.release(held).unwrap();
    assert!(result.is_err(), "the lock stayed held: {result:?}");
    // Refused at about 0, 1 and 3 s (backoffs of 1, 2, then 4 s), where a
    // fixed backoff would have it reconnect about every second.
    assert!(
        (1..=4).contains(&line_connects),
        "{line_connects} subscription connections in 6.5 s"
    );
}
