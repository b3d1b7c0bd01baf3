//! `inspect`: a read-only look at what each node holds for a resource, in
//! one round of one read-only script.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::Redlock;
use crate::error::{ArgumentError, LockError, NodeError, NodeOutcome};
use crate::kind::{fence_keys, side_keys, Kind};
use crate::store::script::{Command, INSPECT};

/// How many characters of a token [`inspect`](Redlock::inspect) shows:
/// enough to tell holders apart, too few to release the lock with.
const SHOWN: usize = 8;

/// How many holders a [`Verdict::Shared`] lists, the first by expiry.
const LISTED: usize = 100;

/// What [`Redlock::inspect`] found: each node's view, and a quorum's
/// [`verdict`](Self::verdict).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Inspection {
    /// The resource inspected.
    pub resource: String,
    /// How many nodes make a quorum for a writer or a reader: a majority.
    /// A [`Kind::Semaphore`] holder needs more: the [`Verdict`] carries
    /// the quorum it counted against.
    pub quorum: usize,
    /// Each node, in the client's order.
    pub nodes: Vec<NodeView>,
}

/// What one node holds for the resource.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NodeView {
    /// The node's address (never a password).
    pub node: Arc<str>,
    /// The lock key on that node, or why the node did not answer.
    pub holding: Holding,
    /// The resource's fencing counter there, if it was ever locked fenced.
    pub fence: Option<u64>,
    /// The time left of the longest live intent of a writer that waits
    /// there (see [the writer's turn](crate::contract#shared-and-counted-locks)).
    /// While one stands, the node admits no new reader nor permit holder.
    /// `None`: no intent. [`Duration::MAX`]: one that never expires.
    pub intent: Option<Duration>,
}

/// One holder: on one node in a [`NodeView`], or gathered from every node
/// that holds its token in a [`Verdict`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The token's first 8 characters: enough to tell holders apart, too
    /// few to release the lock with.
    pub token: String,
    /// Its time left, the least over its nodes. `None`: the key never
    /// expires, so this crate did not set it.
    pub ttl: Option<Duration>,
    /// Its owner label ([`LockOptions::owner`](crate::LockOptions::owner)).
    pub owner: Option<String>,
    /// On how many nodes: 1 in a [`NodeView`].
    pub nodes: usize,
}

/// The lock key on one node.
///
/// ```no_run
/// # use redlock_sync::{Holding, Redlock};
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// for view in locks.inspect("invoice:42")?.nodes {
///     match view.holding {
///         Holding::Held(h) => println!("{}: {}… ({:?}) for {:?}", view.node, h.token, h.owner, h.ttl),
///         Holding::Shared { kind, count, .. } => println!("{}: {kind:?}, {count} holders", view.node),
///         Holding::NotALock { redis_type } => println!("{}: an application's {redis_type}", view.node),
///         Holding::Free => println!("{}: free", view.node),
///         Holding::Unknown(why) => println!("{}: {why}", view.node),
///         _ => {}
///     }
/// }
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Holding {
    /// No key, or no live holder.
    Free,
    /// A writer: a [`Kind::Plain`] or [`Kind::Fenced`] lock.
    Held(Holder),
    /// Live holders of a [`Kind::Shared`] or [`Kind::Semaphore`] lock, by
    /// expiry.
    Shared {
        /// Their kind.
        kind: Kind,
        /// The first 100 live holders, by expiry.
        holders: Vec<Holder>,
        /// How many live holders there are.
        count: usize,
    },
    /// A key that is not a lock, an application's: no lock is granted
    /// there while it lives. A string is a lock only if token-shaped (40
    /// lowercase hex digits, then optionally `~MARK` and ` OWNER`); a
    /// sorted set only with this crate's marker.
    NotALock {
        /// Its type, as Redis's `TYPE` names it: `string`, `list`, `set`,
        /// `zset`, `hash`, `stream`, or a module's.
        redis_type: String,
    },
    /// The node did not answer, or does not vote: the same server as another
    /// node, or restarted within the grace.
    Unknown(NodeOutcome),
}

/// What a quorum of nodes says. Each holder counts against its own kind's
/// quorum ([`Kind::Semaphore`] says how many nodes a permit needs).
///
/// A holder on fewer nodes than its quorum does not hold. Its attempt
/// failed, or is still under way, or it lost the lock. It shows in the
/// [`NodeView`]s only. The silent nodes may hold anything: the verdict is
/// [`Unknown`](Self::Unknown) only where they could complete a quorum.
///
/// Who holds it, whatever the kind:
///
/// ```no_run
/// # use redlock_sync::Redlock;
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// for h in locks.inspect("export")?.verdict().holders() {
///     println!("{}… {:?}, {:?} left, on {} nodes", h.token, h.owner, h.ttl, h.nodes);
/// }
/// # Ok::<(), redlock_sync::LockError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// One writer (a [`Kind::Plain`] or [`Kind::Fenced`] lock) on a quorum.
    Held {
        /// The writer, gathered from the nodes that hold its token.
        holder: Holder,
        /// The writers' quorum.
        quorum: usize,
    },
    /// Shared or counted holders, each on its kind's quorum. For a
    /// semaphore, the permits left are `K` less `count`.
    Shared {
        /// Their kind.
        kind: Kind,
        /// The first 100 holders by expiry (the least time left first).
        holders: Vec<Holder>,
        /// How many hold, all of them.
        count: usize,
        /// Their kind's quorum.
        quorum: usize,
    },
    /// Held by something that is not a lock: an application's key
    /// ([`Holding::NotALock`]) on a quorum. No lock is granted while it
    /// lives.
    NotALock {
        /// The Redis type that most of those nodes hold.
        redis_type: String,
        /// On how many nodes.
        nodes: usize,
        /// The writers' quorum.
        quorum: usize,
    },
    /// No holder is on its quorum, and the silent nodes cannot make one.
    Free,
    /// The silent nodes could complete a quorum, for a holder seen on
    /// other nodes or one not seen at all: too few answered to tell.
    Unknown {
        /// The least quorum they could complete.
        quorum: usize,
    },
}

impl Verdict {
    /// Who holds: the writer, or the shared or counted holders listed.
    /// Empty when free, unknown, or not a lock.
    pub fn holders(&self) -> &[Holder] {
        match self {
            Verdict::Held { holder, .. } => std::slice::from_ref(holder),
            Verdict::Shared { holders, .. } => holders,
            _ => &[],
        }
    }

    /// The quorum the verdict counted against: the holders' kind's. `None`
    /// when free.
    pub fn quorum(&self) -> Option<usize> {
        match self {
            Verdict::Held { quorum, .. }
            | Verdict::Shared { quorum, .. }
            | Verdict::NotALock { quorum, .. }
            | Verdict::Unknown { quorum } => Some(*quorum),
            _ => None,
        }
    }
}

impl Inspection {
    /// What a quorum says: a writer, shared or counted holders, or a key
    /// that is not a lock, each on its own quorum. Else free, unless the
    /// silent nodes could complete a quorum: then unknown.
    pub fn verdict(&self) -> Verdict {
        let n = self.nodes.len();
        let majority = Kind::Plain.quorum(n);
        let others: Vec<&str> = self
            .nodes
            .iter()
            .filter_map(|v| match &v.holding {
                Holding::NotALock { redis_type } => Some(redis_type.as_str()),
                _ => None,
            })
            .collect();
        if others.len() >= majority {
            return Verdict::NotALock {
                redis_type: most_common(&others),
                nodes: others.len(),
                quorum: majority,
            };
        }
        let groups = self.groups();
        let held: Vec<(Kind, Holder)> = groups
            .iter()
            .filter(|(kind, found)| found.len() >= kind.quorum(n))
            .map(|(kind, found)| (*kind, gathered(found)))
            .collect();
        let Some(&(kind, _)) = held.first() else {
            return self.free_or_unknown(&groups, others.len());
        };
        let quorum = kind.quorum(n);
        let mut holders: Vec<Holder> = held
            .into_iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, holder)| holder)
            .collect();
        if kind == Kind::Plain {
            let holder = holders.swap_remove(0);
            return Verdict::Held { holder, quorum };
        }
        holders.sort_by(|a, b| {
            (a.ttl.is_none(), a.ttl, &a.token).cmp(&(b.ttl.is_none(), b.ttl, &b.token))
        });
        // Past the first 100 a node lists, at most as many hold on a
        // quorum as its quorum-th fullest node counts.
        let mut counts: Vec<usize> = self
            .nodes
            .iter()
            .filter_map(|v| match &v.holding {
                Holding::Shared { kind: k, count, .. } if *k == kind => Some(*count),
                _ => None,
            })
            .collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let mut count = holders.len();
        if counts.first().is_some_and(|&most| most > LISTED) {
            count = count.max(counts.get(quorum - 1).copied().unwrap_or(0));
        }
        holders.truncate(LISTED);
        Verdict::Shared {
            kind,
            holders,
            count,
            quorum,
        }
    }

    /// How long new readers stay out for a waiting writer: while its
    /// intent stands on more nodes than a reader can spare (`N - quorum`),
    /// among the nodes that answered. Permit holders need more nodes, so
    /// they stay out at least as long. `None`: no intent stands on that
    /// many.
    pub fn intent(&self) -> Option<Duration> {
        let mut left: Vec<Duration> = self.nodes.iter().filter_map(|v| v.intent).collect();
        left.sort_unstable_by(|a, b| b.cmp(a));
        left.get(self.nodes.len().saturating_sub(self.quorum))
            .copied()
    }

    /// Each holder's entries on the nodes, by kind and token, in token
    /// order. A writer counts as [`Kind::Plain`].
    fn groups(&self) -> Vec<(Kind, Vec<&Holder>)> {
        let mut groups: HashMap<(Kind, &str), Vec<&Holder>> = HashMap::new();
        for view in &self.nodes {
            let (kind, holders) = match &view.holding {
                Holding::Held(holder) => (Kind::Plain, std::slice::from_ref(holder)),
                Holding::Shared { kind, holders, .. } => (*kind, &holders[..]),
                _ => continue,
            };
            for holder in holders {
                let entries = groups.entry((kind, holder.token.as_str()));
                entries.or_default().push(holder);
            }
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_unstable_by(|a, b| a.0 .1.cmp(b.0 .1));
        groups
            .into_iter()
            .map(|((kind, _), found)| (kind, found))
            .collect()
    }

    /// No holder on its quorum: free, unless the silent nodes could
    /// complete one for a holder seen (`groups`), for the keys that are not
    /// locks (on `others` nodes), or for one not seen (a majority of them).
    fn free_or_unknown(&self, groups: &[(Kind, Vec<&Holder>)], others: usize) -> Verdict {
        let n = self.nodes.len();
        let majority = Kind::Plain.quorum(n);
        let unknown = |v: &&NodeView| matches!(v.holding, Holding::Unknown(_));
        let silent = self.nodes.iter().filter(unknown).count();
        let seen = groups
            .iter()
            .map(|(kind, found)| (kind.quorum(n), found.len()));
        let reachable = (seen.chain([(majority, others), (majority, 0)]))
            .filter(|&(quorum, found)| found + silent >= quorum)
            .map(|(quorum, _)| quorum)
            .min();
        match reachable {
            Some(quorum) => Verdict::Unknown { quorum },
            None => Verdict::Free,
        }
    }
}

/// One holder from its entries on several nodes.
fn gathered(found: &[&Holder]) -> Holder {
    Holder {
        token: found[0].token.clone(),
        ttl: found.iter().filter_map(|h| h.ttl).min(),
        owner: found.iter().find_map(|h| h.owner.clone()),
        nodes: found.len(),
    }
}

/// The type named most often; the first such on a tie.
fn most_common(types: &[&str]) -> String {
    let count = |t: &&&str| types.iter().filter(|u| *u == *t).count();
    (types.iter().rev().max_by_key(count)).map_or_else(String::new, |t| t.to_string())
}

/// A holder from its stored value (a writer's `TOKEN[~MARK][ OWNER]`, or a
/// shared or counted holder's token), its time left, and the owner label
/// stored beside a shared or counted holder (empty for none).
fn holder(value: &str, ms: i64, owner: String) -> Holder {
    let owner = match owner.is_empty() {
        true => value.split_once(' ').map(|(_, owner)| owner.to_string()),
        false => Some(owner),
    };
    Holder {
        token: value.chars().take(SHOWN).collect(),
        ttl: u64::try_from(ms).ok().map(Duration::from_millis),
        owner,
        nodes: 1,
    }
}

/// One node's reply to [`INSPECT`] as its view; `None` if garbled.
fn view(node: Arc<str>, value: Value) -> Option<NodeView> {
    let items: Vec<Value> = redis::from_redis_value(value).ok()?;
    let text = |v: &Value| redis::from_redis_value::<String>(v.clone()).ok();
    let number = |v: &Value| redis::from_redis_value::<i64>(v.clone()).ok();
    let fence = text(items.first()?)?.parse().ok();
    let kind = text(items.get(1)?)?;
    let redis_type = text(items.get(2)?)?;
    let intent = match number(items.get(3)?)? {
        -2 => None,
        -1 => Some(Duration::MAX),
        ms => Some(Duration::from_millis(u64::try_from(ms).ok()?)),
    };
    let count = usize::try_from(number(items.get(4)?)?).ok()?;
    let shown = items.get(5..)?.chunks(3);
    let holders = shown
        .map(|three| {
            let value = text(&three[0])?;
            let ms = number(three.get(1)?)?;
            let owner = text(three.get(2)?)?;
            Some(holder(&value, ms, owner))
        })
        .collect::<Option<Vec<_>>>()?;
    let holding = match kind.as_str() {
        "" if redis_type == "none" => Holding::Free,
        "" => Holding::NotALock { redis_type },
        _ if holders.is_empty() => Holding::Free,
        "w" => Holding::Held(holders.into_iter().next()?),
        k => Holding::Shared {
            kind: match k.parse().ok()? {
                0 => Kind::Shared,
                k => Kind::Semaphore(k),
            },
            holders,
            count,
        },
    };
    Some(NodeView {
        node,
        holding,
        fence,
        intent,
    })
}

impl Redlock {
    /// Reads, without writing, what each node holds for `resource`, and what
    /// a quorum says ([`Inspection::verdict`]), with any writer's intent
    /// that holds new readers back ([`Inspection::intent`]). The round goes
    /// through the client's own connections and checks. A node within its
    /// restart grace does not count, and one that does not answer is
    /// unknown.
    ///
    /// # Errors
    ///
    /// [`LockError::Argument`] for an empty resource name.
    pub fn inspect(&self, resource: &str) -> Result<Inspection, LockError> {
        if resource.is_empty() {
            return Err(ArgumentError::EmptyResource.into());
        }
        let mut keys = fence_keys(resource).to_vec();
        let [_, _, _, owners] = side_keys(resource);
        keys.push(owners);
        let cmd = Command::script(&INSPECT, &keys, &[]);
        let nodes = (self.replies(&cmd).into_iter())
            .map(|(node, reply)| {
                let read = reply.and_then(|value| {
                    let garbled = NodeError::Protocol(format!("{value:?}"));
                    view(node.clone(), value).ok_or(NodeOutcome::Failed(garbled))
                });
                read.unwrap_or_else(|why| NodeView {
                    node,
                    holding: Holding::Unknown(why),
                    fence: None,
                    intent: None,
                })
            })
            .collect();
        Ok(Inspection {
            resource: resource.to_string(),
            quorum: self.quorum(),
            nodes,
        })
    }
}
