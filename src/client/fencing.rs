//! Fenced acquisitions: a lock that also yields a fencing token, a number
//! greater than the token of every earlier successful fenced acquisition
//! of the same resource.
//!
//! Two rounds. Round one sets the lock and raises a per-resource counter on
//! each node in one script, and returns the counter; the client takes the
//! largest value from the nodes that granted. Round two raises the counter
//! on each node to at least that value, where the lock still holds our
//! token; the acquisition counts only when a quorum of nodes granted both
//! rounds. The safety argument is in the docs of
//! [`Redlock::acquire_fenced`].

use std::cell::Cell;
use std::time::Duration;

use redis::Value;

use super::{script_vote, Redlock, Tally};
use crate::error::{ArgumentError, LockError, NodeOutcome, NodeReport, Report};
use crate::lock::{check_resources, Lock, Token};
use crate::script::{self, Command};

/// The prefix of the keys that hold the fencing counters: the counter of
/// resource `R` is the key `redlock-sync:fence:R`, on every node.
///
/// A counter never expires: it has to outlive every lock, or a later
/// acquisition could not be given a larger token. It is one small string
/// key per resource ever locked with
/// [`acquire_fenced`](Redlock::acquire_fenced). The prefix is reserved:
/// acquisitions (fenced or not) of resources that start with it are
/// refused with [`ArgumentError::ReservedResource`]; a lock there would
/// stand in the way of fenced locks on the rest of the name. Deleting a
/// counter is safe but for the caveats on node clocks in
/// [`acquire_fenced`](Redlock::acquire_fenced).
///
/// ```
/// use redlock_sync::FENCE_KEY_PREFIX;
///
/// assert_eq!(format!("{FENCE_KEY_PREFIX}invoice:42"), "redlock-sync:fence:invoice:42");
/// ```
pub const FENCE_KEY_PREFIX: &str = "redlock-sync:fence:";

/// Checks the resources of an acquisition: as [`check_resources`], and no
/// name under [`FENCE_KEY_PREFIX`], where the fencing counters live (a
/// lock there would stand in the way of fenced locks on the rest of the
/// name).
pub(crate) fn check_acquirable(resources: &[String]) -> Result<(), ArgumentError> {
    check_resources(resources)?;
    match resources.iter().find(|r| r.starts_with(FENCE_KEY_PREFIX)) {
        Some(reserved) => Err(ArgumentError::ReservedResource(reserved.clone())),
        None => Ok(()),
    }
}

impl Redlock {
    /// Acquires a lock on `resource` for `ttl`, like
    /// [`acquire`](Self::acquire), and also gets a *fencing token*: see
    /// [`Lock::fencing_token`]. Retries per the retry policy.
    ///
    /// A lease can run out while its holder still works (a long GC pause, a
    /// swapped-out process, a VM migration), and then another client may
    /// hold the lock too. A fencing token lets the protected resource reject
    /// the stale holder: every write carries the token, and the resource
    /// keeps the highest token it has seen and refuses any write with a
    /// lower one, atomically with the write itself (a conditional update, a
    /// compare-and-set, a check in the same transaction). A holder whose
    /// write is refused has lost the lock and must stop.
    ///
    /// ```no_run
    /// # use redlock_sync::Redlock;
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])?;
    /// let lock = locks.acquire_fenced("ledger", Duration::from_secs(10))?;
    /// let token = lock.fencing_token().expect("a fenced lock has a token");
    /// // UPDATE ledger SET ..., fence = $token WHERE id = 1 AND fence <= $token
    /// # let _ = token;
    /// locks.release(lock)?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # The guarantee
    ///
    /// The token is strictly greater than the fencing token of every
    /// successful fenced acquisition of the same resource that returned
    /// before this one, as long as no node has lost its data. Any two
    /// successful fenced acquisitions get different tokens (still given no
    /// data loss), whatever the clocks do.
    ///
    /// Each node keeps a counter per resource (see [`FENCE_KEY_PREFIX`]).
    /// Round one runs, on each node, one script: if the lock is free, raise
    /// the counter to the larger of its value plus one and the node's clock
    /// in microseconds, set the lock to our token, and return the counter.
    /// (Every attempt has a token of its own, so a token is set at most
    /// once on a node.)
    /// The client reads every node's round-one reply (it does not stop at a
    /// quorum, so every node that may count has its counter in `T`) and
    /// takes `T`, the largest counter among the nodes that granted. Round
    /// two runs on the nodes that granted round one: if the lock still holds
    /// our token, raise the counter to at least `T`. The acquisition succeeds
    /// when a quorum of nodes granted *both* rounds and validity is left
    /// (measured from the start of round one to the end of round two).
    ///
    /// Why that suffices. Take two successful fenced acquisitions A and B.
    /// Each has a quorum of nodes that granted both rounds, and two quorums
    /// share a node `n`. On `n` the lock key held A's token for one stretch
    /// of time and B's for another, and the two stretches do not overlap:
    /// a key holds one value at a time, and each token is set once, by its
    /// own round one. Say A's came first. A's round two ran on `n` inside
    /// A's stretch and left the counter at `T_A` or more; counters never go
    /// down; B's round one ran on `n` after A's stretch ended, so it raised
    /// the counter to more than `T_A`, and since `n` granted B's round one,
    /// that value is among those `T_B` is the largest of: `T_B > T_A`. And
    /// A's stretch comes first on `n` whenever A returned first: otherwise
    /// B's key would have been gone from `n` before A's round one reached
    /// it, so before A returned, so before B returned; but B's key stays on
    /// `n` at least until B's validity runs out, which is after B returned
    /// (that is what the drift term pays for).
    ///
    /// Round two is what makes the largest value known to a quorum. Without
    /// it, `T` would live only on the node that returned it, and a later
    /// winner whose quorum misses that node could get a smaller token. The
    /// nodes whose round-one reply was lost do not count toward the quorum:
    /// their counter may be higher than `T`.
    ///
    /// # What breaks it, and what the restarted-node guard changes
    ///
    /// A node that loses its data (a restart without persistence, a
    /// `FLUSHALL`, a failover to a replica that had not caught up) loses its
    /// counters. If every node that A and B share had lost them in between,
    /// B could get a smaller token than A. Two things limit that:
    ///
    /// - A counter that restarts from nothing starts again from the node's
    ///   clock, in microseconds since the epoch. Tokens follow the fastest
    ///   node clock (a counter gets ahead of its node's clock only by one
    ///   per fenced acquisition within the same microsecond), so the
    ///   restarted counter is above every token handed out before the data
    ///   loss as long as no node clock is ahead of this node's by more than
    ///   the time from the data loss to the node's next vote.
    /// - The restarted-node guard
    ///   ([`RedlockBuilder::restart_grace`](crate::RedlockBuilder::restart_grace))
    ///   keeps a restarted node from voting for the grace period, so the
    ///   clocks then only need to agree to within the grace (seconds, where
    ///   NTP keeps them within milliseconds), and it also keeps the node
    ///   from granting a lock it forgot. Without the guard, a node that
    ///   restarts and votes at once can hand out a lock that is still held
    ///   (and a token no greater than the holder's, if its clock is behind);
    ///   with it, and with node clocks that agree to within the grace and
    ///   are not set back, restarts without persistence break neither the
    ///   lock nor the token order.
    ///
    /// Data lost without a restart is not caught by the guard. Run the nodes
    /// with `appendonly yes` and `appendfsync always` when the tokens must
    /// not depend on clocks at all.
    ///
    /// Tokens are not consecutive: they follow the node clocks, in
    /// microseconds, and a failed round can use up values. They stay below
    /// 2^53 (until the year 2255); a counter at or above that is refused by
    /// the node (and the node counts as failed). Fenced and plain locks on
    /// the same resource exclude each other; only fenced ones get tokens.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), and
    /// [`ArgumentError::ReservedResource`] for a resource that starts with
    /// [`FENCE_KEY_PREFIX`]. A node whose counter is not a number fails
    /// (its script fails before it writes anything).
    pub fn acquire_fenced(&self, resource: &str, ttl: Duration) -> Result<Lock, LockError> {
        self.acquire_fenced_retrying(resource, ttl, self.inner.config.retry_count)
    }

    /// Like [`acquire_fenced`](Self::acquire_fenced), but one attempt only:
    /// no retry.
    ///
    /// ```no_run
    /// # use redlock_sync::{LockError, Redlock};
    /// # use std::time::Duration;
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// match locks.try_acquire_fenced("ledger", Duration::from_secs(10)) {
    ///     Ok(lock) => {
    ///         println!("writing with fencing token {:?}", lock.fencing_token());
    ///         locks.release(lock)?;
    ///     }
    ///     Err(LockError::Contended { .. }) => println!("someone else is on it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_fenced`](Self::acquire_fenced).
    pub fn try_acquire_fenced(&self, resource: &str, ttl: Duration) -> Result<Lock, LockError> {
        self.acquire_fenced_retrying(resource, ttl, 0)
    }

    /// [`acquire_fenced`](Self::acquire_fenced) with up to `retries`
    /// retries.
    pub(crate) fn acquire_fenced_retrying(
        &self,
        resource: &str,
        ttl: Duration,
        retries: u32,
    ) -> Result<Lock, LockError> {
        let resources = vec![resource.to_string()];
        check_acquirable(&resources)?;
        let ttl_ms = self.check_ttl(ttl)?;
        let keys = [
            resource.to_string(),
            format!("{FENCE_KEY_PREFIX}{resource}"),
        ];
        self.acquire_loop(resources, ttl_ms, retries, |_, token, ttl| {
            self.fenced_rounds(&keys, token, ttl, ttl_ms)
        })
    }

    /// One fenced attempt: round one, and round two if round one won. The
    /// tally counts a node as granted only if it granted both rounds.
    fn fenced_rounds(
        &self,
        keys: &[String; 2],
        token: &Token,
        ttl: Duration,
        ttl_ms: u64,
    ) -> (Tally, Option<u64>) {
        let highest = Cell::new(0u64);
        let claim = Command::script(
            &script::FENCE_ACQUIRE,
            keys,
            &[&token.hex(), ttl_ms.to_string().as_bytes()],
        );
        // Round one reads every reply (no early decision): every node that
        // may count must have its counter in the token, so a node whose
        // round-one reply went unread must not confirm in round two.
        let first = self.round_reading_every_reply(&claim, ttl, claim_vote(&highest));
        if !first.granted() {
            return (first, None);
        }
        let fence = highest.get();
        let confirm = Command::script(
            &script::FENCE_CONFIRM,
            keys,
            &[&token.hex(), fence.to_string().as_bytes()],
        );
        // Round two asks only the nodes that granted round one: each of its
        // confirmations counts, so it may stop once a quorum confirmed.
        let granted: Vec<bool> = first
            .report
            .nodes
            .iter()
            .map(|n| n.outcome == NodeOutcome::Granted)
            .collect();
        let second = self.round_asking_only(&granted, &confirm, ttl, script_vote);
        (self.both_rounds(first, second, ttl), Some(fence))
    }

    /// Merges the tallies of the two rounds: a node that granted round one
    /// shows its round-two outcome, any other node its round-one outcome;
    /// times and validity are measured from the start of round one.
    fn both_rounds(&self, first: Tally, second: Tally, ttl: Duration) -> Tally {
        let offset = second.start.saturating_duration_since(first.start);
        let elapsed = offset + second.report.elapsed;
        let nodes = first
            .report
            .nodes
            .into_iter()
            .zip(second.report.nodes)
            .map(|(one, two)| match one.outcome {
                NodeOutcome::Granted => NodeReport {
                    elapsed: offset + two.elapsed,
                    ..two
                },
                _ => one,
            })
            .collect();
        let validity = self.validity(ttl, elapsed);
        Tally {
            report: Report {
                nodes,
                quorum: first.report.quorum,
                elapsed,
            },
            validity,
            start: first.start,
            // Round one won: a node that refused round two no longer held
            // our key, and with no validity left, that key had expired. The
            // attempt ran out of time; no other client made it fail.
            too_slow: validity.is_none(),
        }
    }
}

/// A round-one reply as a vote: a counter (granted, and the largest so far
/// kept in `highest`), or 0 (refused: the lock is held).
fn claim_vote(highest: &Cell<u64>) -> impl Fn(&Value) -> Result<bool, &Value> + '_ {
    move |value| match value {
        Value::Int(n) if *n > 0 => {
            highest.set(highest.get().max(n.unsigned_abs()));
            Ok(true)
        }
        Value::Int(0) => Ok(false),
        other => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    /// A report of three nodes that all answered `outcome` after `elapsed`.
    fn report(outcome: NodeOutcome, elapsed: Duration) -> Report {
        let node = |i: usize| NodeReport {
            node: Arc::from(format!("127.0.0.1:{i}")),
            outcome: outcome.clone(),
            elapsed,
        };
        Report {
            nodes: (1..=3).map(node).collect(),
            quorum: 2,
            elapsed,
        }
    }

    /// Round one granted everywhere in 1 ms; round two, `gap` later, found
    /// the keys gone everywhere (refused) in 1 ms.
    fn won_then_refused(locks: &Redlock, ttl: Duration, gap: Duration) -> Tally {
        let start = Instant::now();
        let one_ms = Duration::from_millis(1);
        let first = Tally {
            report: report(NodeOutcome::Granted, one_ms),
            validity: locks.validity(ttl, one_ms),
            start,
            too_slow: false,
        };
        assert!(first.granted(), "round one won");
        let second = Tally {
            report: report(NodeOutcome::Refused, one_ms),
            validity: None,
            start: start + one_ms + gap,
            too_slow: false,
        };
        locks.both_rounds(first, second, ttl)
    }

    fn offline() -> Redlock {
        Redlock::new([
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ])
        .expect("valid URLs")
    }

    #[test]
    fn keys_that_expired_between_the_two_fenced_rounds_make_the_attempt_too_slow_not_contended() {
        let locks = offline();
        // A 4 ms TTL, as in the property test that found it: round one left
        // validity, round two came 4 ms later, after the keys expired.
        let ttl = Duration::from_millis(4);
        let both = won_then_refused(&locks, ttl, ttl);
        assert!(!both.granted());
        match both.error("r", 1, ttl) {
            LockError::TooSlow {
                resource, ttl: t, ..
            } => assert_eq!((&*resource, t), ("r", ttl)),
            other => panic!("expected TooSlow, got {other}"),
        }
    }

    #[test]
    fn keys_gone_before_round_two_with_validity_left_are_not_called_too_slow() {
        // Validity was left: the keys did not expire, so time is not why
        // the attempt failed.
        let locks = offline();
        let ttl = Duration::from_secs(10);
        let both = won_then_refused(&locks, ttl, Duration::from_millis(1));
        assert!(!both.granted());
        assert!(!matches!(
            both.error("r", 1, ttl),
            LockError::TooSlow { .. }
        ));
    }
}
