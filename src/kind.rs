//! Kinds of lock: their checks, scripts, votes, quorum and rounds.
//! Every operation asks the lock's kind, so a new kind is a variant here.

use crate::error::ArgumentError;
use crate::store::script::{self, Command};
use crate::store::{self, fence_key, intents_key, older_intent_key, owners_key, released_channel};
use crate::time::Ttl;
use crate::token::Token;

/// What kind of lock a call takes ([`LockOptions::kind`](crate::LockOptions::kind)),
/// and which a [`Lock`](crate::Lock) or [`LockGuard`](crate::LockGuard) is.
///
/// ```no_run
/// # use std::time::Duration;
/// use redlock_sync::{Kind, LockOptions, Redlock};
///
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// let lock = locks.acquire("ledger", LockOptions::new(Duration::from_secs(10)).kind(Kind::Fenced))?;
/// assert_eq!(lock.kind(), Kind::Fenced);
/// let token = lock.fencing_token().expect("a fenced lock has a token");
/// // UPDATE ledger SET ..., fence = $token WHERE id = 1 AND fence <= $token
/// # let _ = token;
/// locks.release(lock)?;
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
///
/// A lease can run out while its holder still works (a GC pause, swapping,
/// a VM migration). Another client may then hold the lock too. A fencing
/// token lets the protected resource refuse the stale holder. Each write
/// carries the token. The resource keeps the highest token it has seen.
/// It refuses a write with a lower one, atomically with the write (a
/// conditional update, a compare-and-set). A holder whose write is refused
/// has lost the lock and must stop.
///
/// # Fenced: the guarantee
///
/// The token exceeds that of every successful fenced acquisition of the
/// resource that returned before. Any two successful ones get different
/// tokens, whatever the clocks do. Both claims assume no data loss.
///
/// Each node keeps a counter per resource (see [`fence_key`](crate::fence_key)).
/// Round one runs one script on each node. If the lock is free, it raises
/// the counter to `max(counter + 1, node clock in µs)`. It sets the lock to
/// our token and returns the counter. Every attempt has its own token, so
/// one acquisition at most sets it on a node. An extension may set it again
/// on a node that lost it: a re-take (see
/// [`Redlock::extend`](crate::Redlock::extend)). The client reads every
/// node's reply, not just a quorum's. It takes `T`, the largest counter
/// among the nodes that granted. Round two runs on those nodes. Where the
/// lock still holds our token, it raises the counter to at least `T`. The
/// acquisition succeeds when a quorum granted *both* rounds and validity
/// is left. Validity runs from the start of round one to the end of round
/// two.
///
/// Why that suffices:
///
/// 1. Take two successful fenced acquisitions A and B. Their two quorums
///    share a node `n`.
/// 2. On `n`, the lock key held A's token for one stretch and B's for
///    another. A key holds one value at a time, so the stretches do not
///    overlap. (Later re-takes add stretches; the argument is about the
///    first ones.)
/// 3. Say A's stretch came first. A's round two ran on `n` inside it and
///    left the counter at `T_A` or more. Counters never go down, data
///    loss aside.
/// 4. B's round one ran on `n` after A's stretch. It raised the counter
///    above `T_A`. `n` granted it, so `T_B` is at least that: `T_B > T_A`.
/// 5. A's stretch comes first whenever A returned first. Otherwise B's key
///    was gone from `n` before A's round one reached it. That is before A
///    returned, so before B returned. But B's key stays until B's validity
///    runs out, after B returned. The drift term pays for that.
///
/// Round two makes the largest value known to a quorum. Without it, `T`
/// would live only on the node that returned it. A later winner whose
/// quorum misses that node could get a smaller token. A node whose
/// round-one reply was lost does not count: its counter may exceed `T`.
///
/// # Fenced: what breaks it
///
/// A node that loses its data loses its counters. If every node A and B
/// share lost them in between, B could get a smaller token than A. Three
/// things limit that:
///
/// - Each extension of a held lock re-takes a node that lost the key. It
///   raises the counter there to at least the lock's token. A rolling
///   restart under a held lock loses no counter that matters.
/// - A lost counter restarts from the node's clock, in µs since the epoch.
///   Tokens follow the fastest node clock. So the new counter tops every
///   earlier token, unless some node's clock is further ahead. The margin
///   is the time from the loss to this node's next vote.
/// - The restarted-node guard
///   ([`RedlockBuilder::restart_grace`](crate::RedlockBuilder::restart_grace))
///   keeps a restarted node from voting for the grace period. The clocks
///   then need only agree to within the grace: seconds, where NTP keeps
///   milliseconds. With it, and clocks not set back, restarts without
///   persistence keep the token order.
///
/// [The contract](crate::contract) says what each fault does to the lock
/// itself. Data lost without a restart escapes the guard. Run the nodes
/// with `appendonly yes` and `appendfsync always` for tokens that never
/// depend on clocks.
///
/// Tokens are not consecutive: they follow the node clocks, and a failed
/// round uses up values. They stay below 2^53 (until the year 2255). A node
/// refuses a counter at or above that, and counts as failed. Fenced and
/// plain locks on a resource exclude each other; only fenced ones get
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Kind {
    /// An exclusive lock on one resource or several (all or nothing). One
    /// round: `SET NX`, or a script for several resources.
    #[default]
    Plain,
    /// An exclusive lock on one resource, with a *fencing token*
    /// ([`Lock::fencing_token`](crate::Lock::fencing_token)). The token
    /// exceeds that of every earlier fenced lock on the resource. Two
    /// rounds; the guarantee is above. Several resources fail with
    /// [`ArgumentError::OneResource`].
    Fenced,
    /// The read side of a read-write lock on one resource: any number of
    /// `Shared` holders at once, or one writer ([`Plain`](Self::Plain) or
    /// [`Fenced`](Self::Fenced)), never both. One round. Readers get no
    /// fencing token: they do not exclude one another. Several resources
    /// fail with [`ArgumentError::OneResource`]. The safety argument, the
    /// writers' turn and the costs are in
    /// [the contract](crate::contract#shared-and-counted-locks).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use redlock_sync::{Kind, LockOptions, Redlock};
    ///
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// let ttl = Duration::from_secs(10);
    /// let read = LockOptions::new(ttl).kind(Kind::Shared);
    /// let (one, two) = (locks.acquire("catalog", read.clone())?, locks.acquire("catalog", read)?);
    /// assert!(locks.try_acquire("catalog", ttl).is_err()); // a writer waits for both
    /// locks.release(one)?;
    /// locks.release(two)?;
    /// let writer = locks.acquire("catalog", ttl)?; // the write side: a plain lock
    /// # let _ = writer;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    Shared,
    /// A semaphore: at most `K` holders of one resource at once. Each node
    /// admits at most `K`, and a holder needs more than `N K / (K + 1)` of
    /// the `N` nodes: a majority for `K = 1`, 4 of 5 nodes for `K = 2` or
    /// 3, all 5 from `K = 4`. One round. `K = 0` fails with
    /// [`ArgumentError::ZeroPermits`], several resources with
    /// [`ArgumentError::OneResource`]. While holders live, a call with
    /// another `K` fails with [`NodeError::OtherKind`](crate::NodeError::OtherKind).
    /// See [the contract](crate::contract#shared-and-counted-locks).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use redlock_sync::{Kind, LockError, LockOptions, Redlock};
    ///
    /// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
    /// // At most 2 exports at once, each labelled with who runs it.
    /// let permit = LockOptions::new(Duration::from_secs(60))
    ///     .kind(Kind::Semaphore(2))
    ///     .owner("host-a:4242");
    /// locks.with_lock("export", permit, |_guard| {
    ///     // ... one of at most 2 exports ...
    ///     Ok::<(), LockError>(())
    /// })?;
    /// # Ok::<(), redlock_sync::LockError>(())
    /// ```
    Semaphore(u32),
}

impl Kind {
    pub(crate) fn check(self, resources: &[String]) -> Result<(), ArgumentError> {
        if resources.is_empty() {
            return Err(ArgumentError::NoResources);
        }
        for (i, resource) in resources.iter().enumerate() {
            if resource.is_empty() {
                return Err(ArgumentError::EmptyResource);
            }
            if resources[..i].contains(resource) {
                return Err(ArgumentError::DuplicateResource(resource.clone()));
            }
        }
        match self {
            Kind::Semaphore(0) => Err(ArgumentError::ZeroPermits),
            Kind::Plain => Ok(()),
            _ if resources.len() > 1 => Err(ArgumentError::OneResource(self.name())),
            _ => Ok(()),
        }
    }

    /// As [`check`](Self::check), and no name under the crate's prefix
    /// `redlock-sync:`: a lock there would block the side keys of others.
    pub(crate) fn check_acquirable(self, resources: &[String]) -> Result<(), ArgumentError> {
        self.check(resources)?;
        let reserved = resources.iter().find(|r| r.starts_with(store::PREFIX));
        reserved.map_or(Ok(()), |r| Err(ArgumentError::ReservedResource(r.clone())))
    }

    /// The nodes that must agree: a majority, or for `K` permits more than
    /// `N K / (K + 1)`, so that `K + 1` holders would need more admissions
    /// than the `N K` places the nodes have.
    pub(crate) fn quorum(self, nodes: usize) -> usize {
        match self {
            Kind::Semaphore(k) => (nodes as u64 * u64::from(k) / (u64::from(k) + 1)) as usize + 1,
            _ => nodes / 2 + 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Fenced => "fenced",
            Kind::Shared => "shared",
            Kind::Semaphore(_) => "semaphore",
        }
    }

    /// The kind its holders' marker names: `0` for readers, `K`.
    fn counts(self) -> Option<u32> {
        match self {
            Kind::Shared => Some(0),
            Kind::Semaphore(k) => Some(k),
            _ => None,
        }
    }

    /// Whether holders live in a sorted set ([`script::SHARED`]).
    pub(crate) fn is_counted(self) -> bool {
        self.counts().is_some()
    }

    /// Whether an acquisition takes a second round ([`confirm`](Self::confirm)).
    pub(crate) fn confirms(self) -> bool {
        self == Kind::Fenced
    }

    /// The command of a one-round acquisition, or a fenced one's first,
    /// storing `value`. A writer that waited passes its acquisition's
    /// `intent` id, to mark it where shared or counted holders hold (see
    /// [`script::WITHDRAW`]).
    pub(crate) fn acquire(
        self,
        resources: &[String],
        value: &str,
        ttl: Ttl,
        intent: Option<&str>,
    ) -> Command {
        let number = ttl.ms().to_string();
        let mut args: Vec<&[u8]> = vec![value.as_bytes(), number.as_bytes()];
        args.extend(intent.map(str::as_bytes));
        match (self, resources) {
            (Kind::Fenced, [one]) => {
                Command::script(&script::FENCE_ACQUIRE, &fence_keys(one), &args)
            }
            (Kind::Plain, [one]) if intent.is_none() => Command::acquire(one, value, ttl.ms()),
            (Kind::Plain, _) => {
                let mut keys = resources.to_vec();
                keys.extend(resources.iter().map(|r| intents_key(r)));
                Command::script(&script::ACQUIRE_MANY, &keys, &args)
            }
            // Checked: one resource.
            (_, one) => self.shared("acquire", &one[0], &[value, &number]),
        }
    }

    /// The command that withdraws a writer's `intent` from `resources`, once
    /// its acquisition ends (see [`script::WITHDRAW`]). None for the other
    /// kinds: they mark no intent.
    pub(crate) fn withdraw(self, resources: &[String], intent: &str) -> Option<Command> {
        if self.is_counted() {
            return None;
        }
        let keys: Vec<String> = resources.iter().map(|r| intents_key(r)).collect();
        Some(Command::script(
            &script::WITHDRAW,
            &keys,
            &[intent.as_bytes()],
        ))
    }

    /// A [`script::SHARED`] call of `op` on `resource`: `parts` are the
    /// member and TTL, or the token.
    fn shared(self, op: &str, resource: &str, parts: &[&str]) -> Command {
        let k = self.counts().unwrap_or_default().to_string();
        let args: Vec<&[u8]> = [op]
            .iter()
            .chain(parts)
            .chain([&&*k])
            .map(|a| a.as_bytes())
            .collect();
        Command::script(&script::SHARED, &side_keys(resource), &args)
    }

    /// A fenced acquisition's second round: raise the counter to `fence`
    /// where the lock still holds `token`.
    pub(crate) fn confirm(self, resources: &[String], value: &str, fence: u64) -> Command {
        let keys = &fence_keys(&resources[0])[..2];
        let number = fence.to_string();
        let args: &[&[u8]] = &[value.as_bytes(), number.as_bytes()];
        Command::script(&script::FENCE_CONFIRM, keys, args)
    }

    /// The release of the lock `token` holds on `resources` (see [`script::RELEASE`]).
    pub(crate) fn release(self, resources: &[String], token: &Token, by: Release) -> Command {
        let hex = token.hex();
        if self.is_counted() {
            let op = if by == Release::CleanUp {
                "quiet"
            } else {
                "release"
            };
            return self.shared(op, &resources[0], &[&token.to_string(), ""]);
        }
        if by == Release::CleanUp {
            return Command::script(&script::RELEASE, resources, &[&hex, script::QUIET]);
        }
        let mut keys = resources.to_vec();
        keys.extend(resources.iter().map(|r| released_channel(r)));
        Command::script(&script::RELEASE, &keys, &[&hex])
    }

    /// One lock's keys and arguments for [`script::EXTEND`], or for
    /// [`script::SHARED`]'s `extend` (three of each). `retake`, the fencing
    /// token or zero, lets it set absent keys: a fenced lock only with its
    /// token.
    pub(crate) fn extend(
        self,
        resources: &[String],
        value: &str,
        ttl: Ttl,
        retake: Option<u64>,
    ) -> (Vec<String>, Vec<String>) {
        if let Some(k) = self.counts() {
            let args = vec![value.to_string(), ttl.ms().to_string(), k.to_string()];
            return (side_keys(&resources[0]).to_vec(), args);
        }
        let fence = retake.filter(|&f| (self == Kind::Fenced) == (f > 0));
        let keys = match fence {
            Some(f) if f > 0 => fence_keys(&resources[0])[..2].to_vec(),
            _ => resources.to_vec(),
        };
        let fence = fence.map(|f| f.to_string()).unwrap_or_default();
        let count = keys.len().to_string();
        let args = vec![count, value.to_string(), ttl.ms().to_string(), fence];
        (keys, args)
    }
}

/// Who releases: the holder, or the clean-up after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    Holder,
    CleanUp,
}

/// The keys of [`script::SHARED`]: the resource, its writers' intents, an
/// older client's intent, the release channel, and the holders' owners.
pub(crate) fn side_keys(resource: &str) -> [String; 5] {
    [
        resource.to_string(),
        intents_key(resource),
        older_intent_key(resource),
        released_channel(resource),
        owners_key(resource),
    ]
}

/// The keys of a fenced lock's scripts: the lock, its counter, and its
/// writers' intents.
pub(crate) fn fence_keys(resource: &str) -> [String; 3] {
    [
        resource.to_string(),
        fence_key(resource),
        intents_key(resource),
    ]
}

#[cfg(test)]
mod tests {
    use super::Kind;

    #[test]
    fn quorums_match_the_contracts_table() {
        // (N, K, q) as docs/contract.md lists them; K = 0 is a writer.
        let table = [
            (1, 0, 1),
            (3, 0, 2),
            (4, 0, 3),
            (5, 0, 3),
            (3, 1, 2),
            (3, 2, 3),
            (5, 1, 3),
            (5, 2, 4),
            (5, 3, 4),
            (5, 4, 5),
            (7, 2, 5),
            (7, 5, 6),
            (7, 6, 7),
        ];
        for (n, k, q) in table {
            let kind = if k == 0 {
                Kind::Plain
            } else {
                Kind::Semaphore(k)
            };
            assert_eq!(kind.quorum(n), q, "N = {n}, K = {k}");
            // K + 1 holders would need more admissions than the N K places.
            assert!(k == 0 || (k as usize + 1) * q > n * k as usize);
        }
        assert_eq!(Kind::Shared.quorum(5), 3);
        assert_eq!(Kind::Semaphore(u32::MAX).quorum(5), 5);
    }
}
