//! Fenced acquisitions: two rounds that also yield a fencing token. How
//! they work, and the safety argument, are in [`Kind`].

use std::time::Duration;

use super::{Ask, Redlock, Tally};
use crate::error::NodeOutcome;
use crate::kind::Kind;
use crate::store::reply::{ACQUIRED, CONFIRMED};
use crate::time::Ttl;

impl Redlock {
    /// One attempt on the resources `names`: one round, or a fenced
    /// acquisition's two. A fenced attempt counts a node as granted only if
    /// it granted both rounds. The tally carries round one's fencing token.
    /// A writer that waited passes its acquisition's `intent` id, to mark
    /// it where shared or counted holders hold.
    pub(super) fn attempt(
        &self,
        kind: Kind,
        names: &[String],
        value: &str,
        ttl: Ttl,
        intent: Option<&str>,
    ) -> Tally {
        let claim = kind.acquire(names, value, ttl, intent);
        let ttl = ttl.duration();
        // A fenced round one reads every reply (no early decision): every
        // node that may count must have its counter in the token, so a node
        // whose round-one reply went unread must not confirm in round two.
        // A shared or counted attempt is refused while the resource is full,
        // again and again: it reads every reply, and cleans up only where it
        // was admitted. One round, one command a node, full or not.
        let ask = if kind.confirms() {
            Ask::EveryReply
        } else if kind.is_counted() {
            Ask::UntilGranted
        } else {
            Ask::UntilDecided
        };
        let first = self.round(kind, &claim, ttl, ACQUIRED, ask);
        if !kind.confirms() || !first.granted() {
            return first;
        }
        let confirm = kind.confirm(names, value, first.fence);
        // Round two asks only the nodes that granted round one: each of its
        // confirmations counts, so it may stop once a quorum confirmed.
        let granted: Vec<bool> = (first.report.nodes.iter())
            .map(|n| n.outcome == NodeOutcome::Granted)
            .collect();
        let second = self.round(kind, &confirm, ttl, CONFIRMED, Ask::Only(&granted));
        self.both_rounds(first, second, ttl)
    }

    /// Merges the two rounds' tallies. A node that granted round one shows
    /// its round-two outcome. Times and validity count from round one.
    fn both_rounds(&self, mut first: Tally, second: Tally, ttl: Duration) -> Tally {
        let offset = second.start.saturating_duration_since(first.start);
        for (one, mut two) in first.report.nodes.iter_mut().zip(second.report.nodes) {
            if one.outcome == NodeOutcome::Granted {
                two.elapsed += offset;
                *one = two;
            }
        }
        first.report.elapsed = offset + second.report.elapsed;
        first.validity = self.validity(ttl, first.report.elapsed);
        // Round one won: a node that refused round two no longer held
        // our key, and with no validity left, that key had expired. The
        // attempt ran out of time; no other client made it fail.
        first.too_slow = first.validity.is_none();
        first
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;
    use crate::client::Op;
    use crate::error::{LockError, NodeReport, Report};

    /// A report of three nodes that all answered `outcome` after `elapsed`.
    fn report(outcome: NodeOutcome, elapsed: Duration) -> Report {
        let node = |i: usize| NodeReport {
            node: Arc::from(format!("127.0.0.1:{i}")),
            outcome: outcome.clone(),
            elapsed,
            retook: false,
        };
        Report {
            nodes: (1..=3).map(node).collect(),
            quorum: 2,
            elapsed,
            verb: "granted",
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
            fence: 1,
            taken: 0,
        };
        assert!(first.granted(), "round one won");
        let second = Tally {
            report: report(NodeOutcome::Refused, one_ms),
            validity: None,
            start: start + one_ms + gap,
            too_slow: false,
            fence: 0,
            taken: 0,
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
        match both.error("r", 1, Ttl::whole_ms(ttl), Op::Acquire) {
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
            both.error("r", 1, Ttl::whole_ms(ttl), Op::Acquire),
            LockError::TooSlow { .. }
        ));
    }
}
