//! `inspect`: a read-only look at what each node holds for a resource, in
//! one round of one read-only script.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::Redlock;
use crate::error::{ArgumentError, LockError, NodeError, NodeOutcome};
use crate::kind::{fence_keys, Kind};
use crate::script::{Command, Script};

/// Reads the fencing counter, the kind of a sorted set's holders (its
/// marker's), then each live holder's value and time left: a writer's key,
/// or the set's members. A key of another type, or a sorted set not of this
/// crate, is an error: the node's view is unknown.
/// It has no bit: it always goes as `EVAL`, and is never loaded with the
/// lock scripts.
const INSPECT: Script = Script {
    bit: 0,
    body: r#"local MARKER = 'redlock-sync:kind='
local time = redis.call('time')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local t = redis.call('type', KEYS[1]).ok
local out = {redis.call('get', KEYS[2]) or '', ''}
if t == 'zset' then
  local first = redis.call('zrange', KEYS[1], 0, 0)[1]
  if string.sub(first, 1, #MARKER) ~= MARKER then
    return redis.error_reply('WRONGTYPE a sorted set not of this crate')
  end
  out[2] = string.sub(first, #MARKER + 1)
  local z = redis.call('zrangebyscore', KEYS[1], '(' .. now, '+inf', 'withscores')
  for i = 1, #z, 2 do
    out[#out + 1] = z[i]
    out[#out + 1] = z[i + 1] - now
  end
elseif t ~= 'none' then
  out[3] = redis.call('get', KEYS[1])
  out[4] = redis.call('pttl', KEYS[1])
end
return out"#,
    sha: "302195d6e5a7e0b6a5beb0fe50b766bc88e68586",
};

/// How many characters of a token [`inspect`](Redlock::inspect) shows:
/// enough to tell holders apart, too few to release the lock with.
const SHOWN: usize = 8;

/// What [`Redlock::inspect`] found: each node's view, and a quorum's
/// [`verdict`](Self::verdict).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Inspection {
    /// The resource inspected.
    pub resource: String,
    /// How many nodes make a quorum for a writer (for a semaphore, see
    /// [`Kind::Semaphore`]).
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
}

/// One holder on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The token's first 8 characters.
    pub token: String,
    /// Its time left. `None`: the key never expires, so this crate did not
    /// set it.
    pub ttl: Option<Duration>,
    /// Its owner label ([`LockOptions::owner`](crate::LockOptions::owner)).
    pub owner: Option<String>,
}

/// The lock key on one node.
///
/// ```no_run
/// # use redlock_sync::{Holding, Redlock};
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// for view in locks.inspect("invoice:42")?.nodes {
///     match view.holding {
///         Holding::Held(h) => println!("{}: {}… ({:?}) for {:?}", view.node, h.token, h.owner, h.ttl),
///         Holding::Shared { kind, holders } => println!("{}: {kind:?}, {} holders", view.node, holders.len()),
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
    /// Live holders of a [`Kind::Shared`] or [`Kind::Semaphore`] lock.
    Shared {
        /// Their kind.
        kind: Kind,
        /// Each live holder.
        holders: Vec<Holder>,
    },
    /// The node did not answer, or does not vote: the same server as another
    /// node, or restarted within the grace.
    Unknown(NodeOutcome),
}

/// What a quorum of nodes says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// One writer's token is on a quorum of nodes.
    Held {
        /// The token's first 8 characters.
        token: String,
        /// On how many nodes.
        nodes: usize,
    },
    /// Shared or counted holders: each token (first 8 characters) on its
    /// kind's quorum. For a semaphore, the permits left are `K` less their
    /// number.
    Shared {
        /// Their kind.
        kind: Kind,
        /// The tokens that hold.
        tokens: Vec<String>,
    },
    /// No token is on a quorum, nor can be with the nodes that did not answer.
    Free,
    /// Too few nodes answered to tell.
    Unknown,
}

impl Inspection {
    /// Held by one writer's token on a quorum, or by shared or counted
    /// holders each on their kind's quorum. Else free if no token can be on
    /// a quorum, else unknown. Free counts the silent nodes as holding it.
    pub fn verdict(&self) -> Verdict {
        let n = self.nodes.len();
        let held = self.nodes.iter().flat_map(|v| match &v.holding {
            Holding::Held(h) => vec![(Kind::Plain, &h.token)],
            Holding::Shared { kind, holders } => {
                holders.iter().map(|h| (*kind, &h.token)).collect()
            }
            _ => vec![],
        });
        let held: Vec<_> = held.collect();
        let count = |t: &(Kind, &String)| held.iter().filter(|u| *u == t).count();
        let unknown = |v: &&NodeView| matches!(v.holding, Holding::Unknown(_));
        let unknown = self.nodes.iter().filter(unknown).count();
        let mut on_quorum: Vec<_> = (held.iter())
            .filter(|t| count(t) >= t.0.quorum(n))
            .collect();
        on_quorum.sort_unstable_by_key(|t| t.1);
        on_quorum.dedup();
        match (on_quorum.first(), held.iter().map(count).max().unwrap_or(0)) {
            (Some((Kind::Plain, token)), _) => Verdict::Held {
                token: token.to_string(),
                nodes: count(on_quorum[0]),
            },
            (Some(&&(kind, _)), _) => Verdict::Shared {
                kind,
                tokens: on_quorum.iter().map(|t| t.1.clone()).collect(),
            },
            (None, top) if top + unknown < self.quorum => Verdict::Free,
            _ => Verdict::Unknown,
        }
    }
}

/// A holder from its stored value (`TOKEN[~MARK][ OWNER]`) and time left.
fn holder(value: &str, ms: i64) -> Holder {
    Holder {
        token: value.chars().take(SHOWN).collect(),
        ttl: u64::try_from(ms).ok().map(Duration::from_millis),
        owner: value.split_once(' ').map(|(_, owner)| owner.to_string()),
    }
}

/// One node's reply to [`INSPECT`] as what it holds and its fencing counter.
fn view(value: Value) -> Option<(Holding, Option<u64>)> {
    let items: Vec<Value> = redis::from_redis_value(value).ok()?;
    let text = |v: &Value| redis::from_redis_value::<String>(v.clone()).ok();
    let (fence, kind) = (text(items.first()?)?.parse().ok(), text(items.get(1)?)?);
    let holders = (items[2..].chunks(2))
        .map(|pair| Some(holder(&text(&pair[0])?, text(pair.get(1)?)?.parse().ok()?)))
        .collect::<Option<Vec<_>>>()?;
    let holding = match (kind.parse::<u32>(), &holders[..]) {
        (_, []) => Holding::Free,
        (Err(_), [one]) => Holding::Held(one.clone()),
        (Ok(0), _) => Holding::Shared {
            kind: Kind::Shared,
            holders,
        },
        (Ok(k), _) => Holding::Shared {
            kind: Kind::Semaphore(k),
            holders,
        },
        _ => return None,
    };
    Some((holding, fence))
}

impl Redlock {
    /// Reads, without writing, what each node holds for `resource`, and what
    /// a quorum says ([`Inspection::verdict`]). The round goes through the
    /// client's own connections and checks. A node within its restart grace
    /// does not count, and one that does not answer is unknown.
    ///
    /// # Errors
    ///
    /// [`LockError::Argument`] for an empty resource name.
    pub fn inspect(&self, resource: &str) -> Result<Inspection, LockError> {
        if resource.is_empty() {
            return Err(ArgumentError::EmptyResource.into());
        }
        let keys = &fence_keys(resource)[..2];
        let cmd = Command::script(&INSPECT, keys, &[]);
        let nodes = (self.replies(&cmd).into_iter())
            .map(|(node, reply)| {
                let read = reply.and_then(|value| {
                    let garbled = NodeError::Protocol(format!("{value:?}"));
                    view(value).ok_or(NodeOutcome::Failed(garbled))
                });
                let (holding, fence) = read.unwrap_or_else(|why| (Holding::Unknown(why), None));
                NodeView {
                    node,
                    holding,
                    fence,
                }
            })
            .collect();
        Ok(Inspection {
            resource: resource.to_string(),
            quorum: self.quorum(),
            nodes,
        })
    }
}
