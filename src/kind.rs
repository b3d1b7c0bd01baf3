//! Kinds of lock: what each one checks, its scripts, its votes, its quorum
//! and its round plan. Acquisition, release, extension, the clean-up after
//! a failed attempt, the watchdog and the waiters all go through the kind
//! of the lock at hand, so a new kind adds a variant here, not methods.

use redis::Value;

use crate::error::ArgumentError;
use crate::script::{self, Command};
use crate::time::Ttl;
use crate::token::Token;

/// The prefix of the keys that hold the fencing counters: the counter of
/// resource `R` is the key `redlock-sync:fence:R`, on every node.
///
/// A counter never expires: it has to outlive every lock, or a later
/// acquisition could not be given a larger token. It is one small string
/// key per resource ever locked with [`Kind::Fenced`]. The prefix is
/// reserved: acquisitions (fenced or not) of resources that start with it
/// are refused with
/// [`ArgumentError::ReservedResource`](crate::ArgumentError::ReservedResource);
/// a lock there would stand in the way of fenced locks on the rest of the
/// name. Deleting a counter is safe but for the caveats on node clocks in
/// [`Kind`].
///
/// ```
/// use redlock_sync::FENCE_KEY_PREFIX;
///
/// assert_eq!(format!("{FENCE_KEY_PREFIX}invoice:42"), "redlock-sync:fence:invoice:42");
/// ```
pub const FENCE_KEY_PREFIX: &str = "redlock-sync:fence:";

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
/// A lease can run out while its holder still works (a long GC pause, a
/// swapped-out process, a VM migration), and then another client may
/// hold the lock too. A fencing token lets the protected resource reject
/// the stale holder: every write carries the token, and the resource
/// keeps the highest token it has seen and refuses any write with a
/// lower one, atomically with the write itself (a conditional update, a
/// compare-and-set, a check in the same transaction). A holder whose
/// write is refused has lost the lock and must stop.
///
/// # Fenced: the guarantee
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
/// (Every attempt has a token of its own, so only one acquisition sets
/// a token on a node; an extension may set it again later, where the
/// node lost the key: a re-take, see [`Redlock::extend`](crate::Redlock::extend).)
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
/// share a node `n`. On `n` the lock key held A's token from A's round
/// one for one stretch of time, and B's from B's round one for another,
/// and the two stretches do not overlap: a key holds one value at a time.
/// (Re-takes may give a token more stretches on `n` later, after its
/// acquisition returned and each while its lock is valid: they change
/// nothing below, which is about the first ones.) Say A's came first.
/// A's round two ran on `n` inside A's stretch and left the counter at
/// `T_A` or more; counters never go down (but for data loss, below); B's
/// round one ran on `n` after A's stretch ended, so it raised
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
/// # Fenced: what breaks it, and what the restarted-node guard changes
///
/// A node that loses its data (a restart without persistence, a
/// `FLUSHALL`, a failover to a replica that had not caught up) loses its
/// counters. If every node that A and B share had lost them in between,
/// B could get a smaller token than A. Three things limit that:
///
/// - While A holds its lock, each extension re-takes the key on a node
///   that lost it and raises the node's counter to at least `T_A` there
///   (a fenced re-take), so a rolling restart under a held lock loses no
///   counter that matters.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Kind {
    /// An exclusive lock on one resource or several (all or nothing): one
    /// round, `SET NX` (a script for several resources).
    #[default]
    Plain,
    /// An exclusive lock on one resource that also gets a *fencing token*
    /// ([`Lock::fencing_token`](crate::Lock::fencing_token)), a number
    /// greater than that of every earlier fenced lock on the resource: two
    /// rounds (see [`FENCE_KEY_PREFIX`](crate::FENCE_KEY_PREFIX) for the
    /// counters, and above for the guarantee). Only
    /// one resource: a fenced call over several is refused with
    /// [`ArgumentError::FencedMany`]. Fenced and plain locks on the same
    /// resource exclude each other.
    Fenced,
}

impl Kind {
    /// Checks the resources of a lock of this kind: not none, no empty
    /// name, no name twice, and one only for a fenced lock.
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
        if self == Kind::Fenced && resources.len() > 1 {
            return Err(ArgumentError::FencedMany);
        }
        Ok(())
    }

    /// Checks the resources of an acquisition: as [`check`](Self::check),
    /// and no name under [`FENCE_KEY_PREFIX`], where the fencing counters
    /// live (a lock there would stand in the way of fenced locks on the rest
    /// of the name).
    pub(crate) fn check_acquirable(self, resources: &[String]) -> Result<(), ArgumentError> {
        self.check(resources)?;
        let reserved = resources.iter().find(|r| r.starts_with(FENCE_KEY_PREFIX));
        reserved.map_or(Ok(()), |r| Err(ArgumentError::ReservedResource(r.clone())))
    }

    /// How many of `nodes` nodes must agree: a majority.
    pub(crate) fn quorum(self, nodes: usize) -> usize {
        nodes / 2 + 1
    }

    /// Whether an acquisition takes two rounds, the second confirming the
    /// first's fencing token.
    pub(crate) fn confirms(self) -> bool {
        self == Kind::Fenced
    }

    /// The command of a one-round acquisition, and the lock keys of a
    /// fenced one (the resource and its counter).
    pub(crate) fn acquire(self, resources: &[String], token: &Token, ttl: Ttl) -> Command {
        let (hex, number) = (token.hex(), ttl.ms().to_string());
        let args: &[&[u8]] = &[&hex, number.as_bytes()];
        match (self, resources) {
            (Kind::Fenced, [one]) => {
                Command::script(&script::FENCE_ACQUIRE, &fence_keys(one), args)
            }
            (_, [one]) => Command::acquire(one, token, ttl.ms()),
            (_, many) => Command::script(&script::ACQUIRE_MANY, many, args),
        }
    }

    /// A fenced acquisition's second round: raise the counter to `fence`
    /// where the lock still holds `token`.
    pub(crate) fn confirm(self, resources: &[String], token: &Token, fence: u64) -> Command {
        let keys = fence_keys(&resources[0]);
        let (hex, number) = (token.hex(), fence.to_string());
        let args: &[&[u8]] = &[&hex, number.as_bytes()];
        Command::script(&script::FENCE_CONFIRM, &keys, args)
    }

    /// The release of the lock `token` holds on `resources`; a clean-up
    /// after a failed attempt is quiet: it publishes nothing, so waiters
    /// hear only a holder's release.
    pub(crate) fn release(self, resources: &[String], token: &Token, by: Release) -> Command {
        let hex = token.hex();
        let args: &[&[u8]] = if by == Release::CleanUp {
            &[&hex, script::QUIET]
        } else {
            &[&hex]
        };
        Command::script(&script::RELEASE, resources, args)
    }

    /// One lock's part of an extension (see [`script::EXTEND`]): its keys
    /// and its four arguments, to extend the lock `token` holds on
    /// `resources` to `ttl_ms`; with `retake`, also where a key is absent
    /// (see [`Redlock::extend`]). `retake` is the lock's fencing token, or
    /// zero for a plain lock: a fenced lock re-takes only with its token,
    /// and raises its counter.
    ///
    /// [`Redlock::extend`]: crate::Redlock::extend
    pub(crate) fn extend(
        self,
        resources: &[String],
        token: &Token,
        ttl: Ttl,
        retake: Option<u64>,
    ) -> (Vec<String>, [String; 4]) {
        let fence = retake.filter(|&f| (self == Kind::Fenced) == (f > 0));
        let keys = match fence {
            Some(f) if f > 0 => fence_keys(&resources[0]).to_vec(),
            _ => resources.to_vec(),
        };
        let fence = fence.map(|f| f.to_string()).unwrap_or_default();
        let count = keys.len().to_string();
        let args = [count, token.to_string(), ttl.ms().to_string(), fence];
        (keys, args)
    }
}

/// Who releases: the holder, or the clean-up after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    Holder,
    CleanUp,
}

/// The keys of a fenced lock's scripts: the lock, and its counter.
pub(crate) fn fence_keys(resource: &str) -> [String; 2] {
    [
        resource.to_string(),
        format!("{FENCE_KEY_PREFIX}{resource}"),
    ]
}

/// A reply to an acquisition as a vote (`Ok((granted, counter))`, or `Err`
/// for a reply not expected): `OK` or 1 (granted), nil or 0 (refused), or a
/// fenced round one's counter (granted, above zero).
pub(crate) fn acquire_vote(value: &Value) -> Result<(bool, u64), &Value> {
    match value {
        Value::Okay => Ok((true, 0)),
        Value::Int(n) if *n > 0 => Ok((true, n.unsigned_abs())),
        Value::Nil | Value::Int(0) => Ok((false, 0)),
        other => Err(other),
    }
}

/// A fenced round two's 1-or-0 reply as a vote.
pub(crate) fn script_vote(value: &Value) -> Result<(bool, u64), &Value> {
    match value {
        Value::Int(1) => Ok((true, 0)),
        Value::Int(0) => Ok((false, 0)),
        other => Err(other),
    }
}

/// An extension's reply as a vote (see [`script::EXTEND`]): only a renewal
/// grants; a re-take (2) tops up a node, but proves nothing of the time
/// the key was missing there, and a key missing where no re-take was
/// allowed (3) refuses.
pub(crate) fn extend_vote(value: &Value) -> Result<(bool, u64), &Value> {
    match value {
        Value::Int(2 | 3) => Ok((false, 0)),
        other => script_vote(other),
    }
}

/// A release script's reply (how many keys it deleted) as a vote: granted
/// if it deleted all `resources` keys.
pub(crate) fn release_vote(resources: usize) -> impl Fn(&Value) -> Result<(bool, u64), &Value> {
    let wanted = resources as i64;
    move |value| match value {
        Value::Int(n) if *n == wanted => Ok((true, 0)),
        Value::Int(_) => Ok((false, 0)),
        other => Err(other),
    }
}
