//! Network faults between the client and the nodes, through the fault
//! proxy: partitions (connections held open but silent), latency, and
//! connection resets.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use common::{cluster, fenced, no_quorum_within, values, wait_until, wait_until_gone, SETTLE};
use redlock_sync::{LockError, NodeOutcome, Redlock, Report, RetryPolicy};
use redlock_sync_testing::{Cluster, Fault, Proxy};

const TTL: Duration = Duration::from_secs(10);
const IO_TIMEOUT: Duration = Duration::from_millis(100);
const RETRY_DELAY: Duration = Duration::from_millis(10);
const RETRY_JITTER: Duration = Duration::from_millis(10);
const RETRY_COUNT: u32 = 3;
/// What scheduling on a busy machine may add to a round.
const SLACK: Duration = Duration::from_millis(100);
/// A round with silent nodes: the io_timeout, plus up to one scheduler tick
/// for each silent node read after the deadline.
const SILENT_ROUND: Duration = Duration::from_millis(100 + 30);

/// Five nodes, a proxy in front of each, and a client that talks to the
/// nodes through the proxies only.
fn behind_proxies() -> (Cluster, Vec<Proxy>, Redlock) {
    let nodes = cluster(5);
    let proxies = nodes.proxies().expect("a proxy per node");
    let locks = Redlock::builder(proxies.iter().map(Proxy::url))
        .retry_policy(
            RetryPolicy::default()
                .retries(RETRY_COUNT)
                .delay(RETRY_DELAY)
                .jitter(RETRY_JITTER),
        )
        .io_timeout(IO_TIMEOUT)
        .connect_timeout(IO_TIMEOUT)
        .build()
        .unwrap();
    // Warm the pools, so that faults hit open connections too.
    for _ in 0..3 {
        locks
            .release(locks.acquire("warm-up", TTL).unwrap())
            .unwrap();
    }
    (nodes, proxies, locks)
}

fn outcomes(report: &Report) -> Vec<&NodeOutcome> {
    report.nodes.iter().map(|n| &n.outcome).collect()
}

/// A node that gave no answer: it timed out, or was not awaited because a
/// quorum had decided the round first (nodes that timed out last are read
/// last), or failed at once because its connect timed out a moment ago and
/// the client backs off reconnecting.
fn silent(outcome: &NodeOutcome) -> bool {
    !matches!(outcome, NodeOutcome::Granted | NodeOutcome::Refused)
}

/// Every node the round waited for granted; none failed or timed out.
fn every_awaited_node_granted(report: &Report) -> bool {
    report.granted() >= report.quorum
        && report
            .nodes
            .iter()
            .all(|n| matches!(n.outcome, NodeOutcome::Granted | NodeOutcome::NotAwaited))
}

#[test]
fn a_partitioned_minority_does_not_stop_progress() {
    let (nodes, proxies, locks) = behind_proxies();
    proxies[0].set_fault(Fault::Partition);
    proxies[1].set_fault(Fault::Partition);
    for i in 0..5 {
        let resource = format!("minority-{i}");
        let lock = if i % 2 == 0 {
            locks.acquire(&resource, TTL)
        } else {
            locks.acquire(&resource, fenced(TTL))
        }
        .unwrap_or_else(|e| panic!("round {i}: 3 of 5 nodes answer, expected the lock, got {e}"));
        let report = lock.report();
        assert!(
            outcomes(report)[..2].iter().all(|o| silent(o)),
            "round {i}: the partitioned nodes time out or are not awaited: {report}"
        );
        assert_eq!(report.granted(), 3, "round {i}: {report}");
        let bound = if i % 2 == 0 { 1 } else { 2 } * SILENT_ROUND + SLACK;
        assert!(
            report.elapsed <= bound,
            "round {i}: acquiring took {:?}, expected at most {bound:?}",
            report.elapsed
        );
        let released = locks
            .release(lock)
            .expect("release on the reachable quorum");
        assert_eq!(released.granted(), 3, "round {i}: {released}");
        // The partitioned nodes never saw the commands.
        assert_eq!(values(&nodes, &resource), vec![None; 5], "round {i}");
    }
}

#[test]
fn a_partitioned_majority_gives_the_quorum_error_within_its_bound() {
    let (nodes, proxies, locks) = behind_proxies();
    for proxy in &proxies[..3] {
        proxy.set_fault(Fault::Partition);
    }
    // Each attempt: a round, a release round (both wait for the silent
    // nodes until the deadline), a pause.
    let bound = (2 * SILENT_ROUND + RETRY_DELAY + RETRY_JITTER) * (RETRY_COUNT + 1) + SLACK;
    let report = no_quorum_within(&locks, "majority", TTL, RETRY_COUNT + 1, bound);
    assert!(
        outcomes(&report)[..3].iter().all(|o| silent(o)),
        "the partitioned nodes time out or are not awaited: {report}"
    );
    assert!(report.granted() <= 2, "{report}");
    wait_until(
        SETTLE,
        "the failed attempts released the reachable nodes",
        || values(&nodes, "majority") == vec![None; 5],
    );
    match locks.try_acquire("majority", fenced(TTL)) {
        Err(LockError::NoQuorum { .. }) => {}
        other => panic!("expected the quorum error for a fenced lock too, got {other:?}"),
    }
}

#[test]
fn after_healing_a_partition_locks_flow_again() {
    let (nodes, proxies, locks) = behind_proxies();
    for proxy in &proxies[..3] {
        proxy.set_fault(Fault::Partition);
    }
    assert!(matches!(
        locks.try_acquire("healing", TTL),
        Err(LockError::NoQuorum { .. })
    ));
    for proxy in &proxies {
        proxy.set_fault(Fault::None);
    }
    // The connections that timed out were dropped: once the reconnect
    // backoff (ten io_timeouts here) is over, new connections go through the
    // healed proxies, and every node answers again.
    wait_until(Duration::from_secs(3), "a quorum answers again", || {
        locks
            .try_acquire("healing", TTL)
            .map(|lock| locks.release(lock).unwrap())
            .is_ok()
    });
    wait_until(Duration::from_secs(3), "every node answers again", || {
        let lock = locks.acquire("healing", TTL).unwrap();
        let all = every_awaited_node_granted(lock.report());
        locks.release(lock).unwrap();
        all
    });
    let lock = locks
        .acquire("healing", TTL)
        .expect("healed: a quorum answers");
    assert!(
        every_awaited_node_granted(lock.report()),
        "{}",
        lock.report()
    );
    locks.release(lock).unwrap();
    let fenced = locks.acquire("healing", fenced(TTL)).unwrap();
    assert!(
        every_awaited_node_granted(fenced.report()),
        "{}",
        fenced.report()
    );
    locks.release(fenced).unwrap();
    wait_until_gone(&nodes, "healing", SETTLE);
}

#[test]
fn a_slow_minority_does_not_slow_rounds_a_slow_majority_does_and_past_the_io_timeout_is_a_timeout()
{
    let (_nodes, proxies, locks) = behind_proxies();
    let delay = Duration::from_millis(20);

    // One slow node: once a round has waited for it, the client reads it
    // last, and the other four decide the rounds without it.
    proxies[0].set_fault(Fault::Delay(delay));
    // Enough rounds that the rotating read order reads node 0 first at
    // least once, and the client sees how long it keeps a round waiting.
    for _ in 0..10 {
        locks.release(locks.acquire("learn", TTL).unwrap()).unwrap();
    }
    // A round that waited for the slow node takes a delayed round trip
    // (2 x 20 ms) or more: most rounds must not, though a busy machine
    // may stall one or two.
    let mut slow_rounds = Vec::new();
    for i in 0..5 {
        let lock = locks.acquire("slow", TTL).unwrap();
        let report = lock.report().clone();
        assert!(report.granted() >= 3, "round {i}: {report}");
        if report.elapsed >= 2 * delay {
            slow_rounds.push(format!("round {i}: {report}"));
        }
        locks.release(lock).unwrap();
    }
    assert!(
        slow_rounds.len() <= 2,
        "a quorum of fast nodes should decide the rounds without the slow one: {slow_rounds:#?}"
    );

    // Three slow nodes: a quorum needs one of them, so the round waits for
    // a delayed round trip, below the io_timeout, and gets the lock.
    for proxy in &proxies[..3] {
        proxy.set_fault(Fault::Delay(delay));
    }
    let lock = locks.acquire("slower", TTL).unwrap();
    let report = lock.report().clone();
    assert!(every_awaited_node_granted(&report), "{report}");
    assert!(
        report.elapsed >= 2 * delay,
        "the round needed a slow node, yet took only {:?}: {report}",
        report.elapsed
    );
    locks.release(lock).unwrap();

    // Two nodes slower than the io_timeout: they time out (or are not
    // awaited once a quorum answered), and the round stays bounded.
    for proxy in &proxies[..3] {
        proxy.set_fault(Fault::None);
    }
    for proxy in &proxies[..2] {
        proxy.set_fault(Fault::Delay(2 * IO_TIMEOUT));
    }
    let lock = locks.acquire("slowest", TTL).unwrap();
    let report = lock.report();
    assert!(outcomes(report)[..2].iter().all(|o| silent(o)), "{report}");
    assert!(
        report.elapsed <= SILENT_ROUND + SLACK,
        "a round with two slow nodes took {:?}",
        report.elapsed
    );
    locks.release(lock).unwrap();
}

#[test]
fn reset_connections_fail_fast_instead_of_timing_out() {
    let (_nodes, proxies, locks) = behind_proxies();
    proxies[3].set_fault(Fault::Reset);
    proxies[4].set_fault(Fault::Reset);
    let lock = locks.acquire("reset", TTL).unwrap();
    let report = lock.report();
    for entry in &report.nodes[3..] {
        assert!(
            matches!(
                entry.outcome,
                NodeOutcome::Failed(_) | NodeOutcome::NotAwaited
            ),
            "a reset node fails (or is not awaited once a quorum granted), got {}: {report}",
            entry.outcome
        );
        assert!(
            entry.elapsed < IO_TIMEOUT,
            "a reset node's outcome came after {:?}, expected before the io_timeout of {IO_TIMEOUT:?}",
            entry.elapsed
        );
    }
    assert!(
        report.elapsed < IO_TIMEOUT,
        "the round waited {:?} for reset nodes",
        report.elapsed
    );
    locks.release(lock).unwrap();
    for proxy in &proxies {
        proxy.set_fault(Fault::None);
    }
    wait_until(Duration::from_secs(2), "every node answers again", || {
        let lock = locks.acquire("reset", TTL).unwrap();
        let all = every_awaited_node_granted(lock.report());
        locks.release(lock).unwrap();
        all
    });
}

#[test]
fn replies_trickled_out_byte_by_byte_do_not_hold_a_round_past_its_deadline() {
    let (_nodes, proxies, locks) = behind_proxies();
    // Three nodes answer one byte every 60 ms: a whole `+OK` reply takes
    // 300 ms, and no single read ever waits long enough to time out.
    for proxy in &proxies[..3] {
        proxy.set_fault(Fault::TrickleReplies(Duration::from_millis(60)));
    }
    let start = std::time::Instant::now();
    let result = locks.try_acquire("trickled", TTL);
    let took = start.elapsed();
    match result {
        Err(LockError::NoQuorum { report, .. }) => {
            assert!(report.elapsed <= IO_TIMEOUT + SLACK, "{report}");
        }
        other => panic!("three silent-ish nodes of five: expected NoQuorum, got {other:?}"),
    }
    assert!(
        took <= 2 * (IO_TIMEOUT + SLACK),
        "the attempt and its clean-up took {took:?}"
    );
    for proxy in &proxies[..3] {
        proxy.set_fault(Fault::None);
    }
    // Once the reconnect backoff that the timed-out connects started is
    // over, locks flow again. (The failed attempt's keys stay on the
    // trickling nodes: its clean-up could not reconnect in time. Another
    // resource is free.)
    wait_until(
        Duration::from_secs(5),
        "the nodes answer again",
        || match locks.acquire("after-trickle", TTL) {
            Ok(lock) => locks.release(lock).is_ok(),
            Err(_) => false,
        },
    );
}

#[test]
fn a_failed_attempt_leaves_no_keys_behind_once_slow_nodes_answer_again() {
    let (nodes, proxies, locks) = behind_proxies();
    let ttl = Duration::from_secs(30);
    // 3 of 5 nodes answer later than io_timeout: their SETs land after the
    // round gave up, and the clean-up cannot reach them (its reconnects time
    // out too, and then the nodes back off reconnecting).
    for proxy in &proxies[..3] {
        proxy.set_fault(Fault::Delay(Duration::from_millis(80)));
    }
    let err = locks.try_acquire("orphan", ttl).unwrap_err();
    assert!(
        matches!(err, LockError::NoQuorum { .. }),
        "3 slow nodes of 5: expected NoQuorum, got {err}"
    );
    wait_until(SETTLE, "the late SETs landed on the 3 slow nodes", || {
        values(&nodes, "orphan").iter().flatten().count() == 3
    });
    for proxy in &proxies {
        proxy.set_fault(Fault::None);
    }
    // Once the client reaches those nodes again (after its reconnect
    // backoff), the clean-up it owes them goes first: the keys go, long
    // before their 30 s TTL would have removed them.
    wait_until(
        Duration::from_secs(5),
        "the orphaned keys were released on the healed nodes",
        || {
            let _ = locks.try_acquire("other", ttl).map(|l| locks.release(l));
            values(&nodes, "orphan").iter().all(Option::is_none)
        },
    );
    let lock = locks
        .try_acquire("orphan", ttl)
        .expect("nothing left holds the resource");
    locks.release(lock).unwrap();
}

/// A clean-up queued behind another thread's connect to the same node is
/// owed, not taken as sent: that connect may fail, and the queued clean-up
/// fails with it.
///
/// Five nodes behind proxies. Thread A's attempt on `queued` sets the key
/// on node 0, which then loses its connection (the proxy resets it); node
/// 4 answers A a second late, so A's round is still waiting when thread U
/// starts connecting to node 0 again, into a connect that never completes
/// (the proxy now holds new connections silent). A's round fails, and its
/// clean-up for node 0 queues behind U's connect, which times out. Once
/// node 0 answers again, the key must go at the client's next connection
/// there, not at the end of its 60 s TTL.
#[test]
fn a_clean_up_queued_behind_another_threads_failing_connect_is_sent_on_the_next_connection() {
    const CONNECT: Duration = Duration::from_secs(2);
    const IO: Duration = Duration::from_secs(3);
    let ttl = Duration::from_secs(60);
    let nodes = cluster(5);
    let proxies = nodes.proxies().expect("a proxy per node");
    let locks = Redlock::builder(proxies.iter().map(Proxy::url))
        .connect_timeout(CONNECT)
        .io_timeout(IO)
        .build()
        .unwrap();
    // An extension reads every node's reply: no reply is left in flight
    // to count as A's below.
    let mut warm_up = locks.try_acquire("warm-up", TTL).unwrap();
    locks.extend(&mut warm_up, TTL).unwrap();
    // Another holder's key on nodes 2 to 4: A gets nodes 0 and 1 only, and
    // its round is decided by node 4's refusal, a second late.
    for i in 2..5 {
        nodes.node(i).set("queued", "another-holder").unwrap();
    }
    proxies[4].set_fault(Fault::Delay(Duration::from_millis(500)));

    let u_done = AtomicBool::new(false);
    let replied = proxies[0].replied_bytes();
    std::thread::scope(|s| {
        let a = s.spawn(|| locks.try_acquire("queued", ttl));
        // Node 0's grant must reach A's socket before its connection ends,
        // or A's round counts node 0 failed and decides without node 4.
        wait_until(SETTLE, "node 0's grant reached A", || {
            proxies[0].replied_bytes() > replied
        });
        assert!(nodes.node(0).get("queued").unwrap().is_some());
        // Node 0's connection ends: a round of another thread reads the
        // reset and ends it.
        proxies[0].set_fault(Fault::Reset);
        let mut probe = 0;
        wait_until(SETTLE, "a round saw node 0's connection fail", || {
            probe += 1;
            let lock = locks.try_acquire(format!("probe-{probe}"), ttl);
            matches!(lock, Ok(l) if matches!(l.report().nodes[0].outcome, NodeOutcome::Failed(_)))
        });
        proxies[0].set_fault(Fault::Partition);
        let u = s.spawn(|| {
            let lock = locks.try_acquire("connecting", ttl);
            u_done.store(true, SeqCst);
            lock
        });
        // U is connecting to node 0 (its connect holds for 2 s).
        match a.join().unwrap() {
            Err(LockError::Contended { report, .. }) => {
                assert_eq!(report.nodes[4].outcome, NodeOutcome::Refused, "{report}")
            }
            other => panic!("expected A's attempt refused by nodes 2 to 4, got {other:?}"),
        }
        assert!(
            !u_done.load(SeqCst),
            "A's round ended after U's connect: its clean-up did not queue behind it"
        );
        let u = u.join().unwrap().expect("nodes 1 to 3 grant U's lock");
        assert!(
            matches!(u.report().nodes[0].outcome, NodeOutcome::TimedOut),
            "U's connect to node 0 timed out: {}",
            u.report()
        );
    });
    // The queued clean-up failed with U's connect: node 0 still holds the key.
    assert!(nodes.node(0).get("queued").unwrap().is_some());
    for proxy in &proxies {
        proxy.set_fault(Fault::None);
    }
    // Once the reconnect backoff is over, the client's next connection to
    // node 0 sends the clean-up it owes first.
    wait_until(Duration::from_secs(8), "A's key left node 0", || {
        let _ = locks.try_acquire("after", ttl).map(|l| locks.release(l));
        nodes.node(0).get("queued").unwrap().is_none()
    });
}
