//! `inspect`: a read-only look at what each node holds for a resource, in
//! one round of one read-only script.

use std::sync::Arc;
use std::time::Duration;

use super::Redlock;
use crate::error::{ArgumentError, LockError, NodeError, NodeOutcome};
use crate::kind::fence_keys;
use crate::script::{Command, Script};

/// Reads the lock key, its time left and the fencing counter. It has no bit:
/// it always goes as `EVAL`, and is never loaded with the lock scripts.
const INSPECT: Script = Script {
    bit: 0,
    body: "return {redis.call('get', KEYS[1]) or '', redis.call('pttl', KEYS[1]), redis.call('get', KEYS[2]) or ''}",
    sha: "6b6bab4dcd950950ab3c340bee7f1b6cc26272c7",
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
    /// How many nodes make a quorum.
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

/// The lock key on one node.
///
/// ```no_run
/// # use redlock_sync::{Holding, Redlock};
/// # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
/// for view in locks.inspect("invoice:42")?.nodes {
///     match view.holding {
///         Holding::Held { token, ttl } => println!("{}: {token}… for {ttl:?}", view.node),
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
    /// No key.
    Free,
    /// A key: the holder's token, shortened, and its time left. `None`: the
    /// key never expires, so this crate did not set it.
    Held {
        /// The token's first 8 characters.
        token: String,
        /// The key's time left.
        ttl: Option<Duration>,
    },
    /// The node did not answer, or does not vote: the same server as another
    /// node, or restarted within the grace.
    Unknown(NodeOutcome),
}

/// What a quorum of nodes says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// One token is on a quorum of nodes.
    Held {
        /// The token's first 8 characters.
        token: String,
        /// On how many nodes.
        nodes: usize,
    },
    /// No token is on a quorum, nor can be with the nodes that did not answer.
    Free,
    /// Too few nodes answered to tell.
    Unknown,
}

impl Inspection {
    /// Held by one token on a quorum, or else free if no token can be on a
    /// quorum, else unknown. Free counts the silent nodes as holding it.
    pub fn verdict(&self) -> Verdict {
        let tokens = self.nodes.iter().filter_map(|n| match &n.holding {
            Holding::Held { token, .. } => Some(token.clone()),
            _ => None,
        });
        let count = |t: &String| tokens.clone().filter(|u| u == t).count();
        let top = tokens.clone().map(|t| (count(&t), t)).max();
        let unknown = |n: &&NodeView| matches!(n.holding, Holding::Unknown(_));
        let unknown = self.nodes.iter().filter(unknown).count();
        match top {
            Some((nodes, token)) if nodes >= self.quorum => Verdict::Held { token, nodes },
            top if top.as_ref().map_or(0, |t| t.0) + unknown < self.quorum => Verdict::Free,
            _ => Verdict::Unknown,
        }
    }
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
        let cmd = Command::script(&INSPECT, &fence_keys(resource), &[]);
        let nodes = (self.replies(&cmd).into_iter())
            .map(|(node, reply)| {
                let read = reply.and_then(|value| {
                    redis::from_redis_value::<(String, i64, String)>(value)
                        .map_err(|e| NodeOutcome::Failed(NodeError::Protocol(e.to_string())))
                });
                let (holding, fence) = match read {
                    Ok((token, _, fence)) if token.is_empty() => (Holding::Free, fence),
                    Ok((token, ms, fence)) => {
                        let (token, ttl) = (token.chars().take(SHOWN).collect(), u64::try_from(ms));
                        let ttl = ttl.ok().map(Duration::from_millis);
                        (Holding::Held { token, ttl }, fence)
                    }
                    Err(outcome) => (Holding::Unknown(outcome), String::new()),
                };
                NodeView {
                    node,
                    holding,
                    fence: fence.parse().ok(),
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
