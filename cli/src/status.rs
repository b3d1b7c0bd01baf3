//! `redlock status`: what each node holds for a resource, read with the
//! library's read-only [`inspect`](redlock_sync::Redlock::inspect). It goes
//! through the library's connections and checks: a server named twice
//! answers once, the restart grace, the timeouts.
//!
//! A resource is free, held by one exclusive holder (a plain or fenced
//! lock), or by shared or counted holders (`--shared`, `--semaphore K`).
//! Each holder shows its token's first 8 characters, its owner label and
//! its time left.

use std::fmt::Write as _;
use std::time::Duration;

use redlock_sync::{Holder, Holding, Inspection, Kind, NodeView, Verdict};
use serde_json::{json, Value};

use crate::args::StatusArgs;
use crate::exit::{self, print_line, say, Failure};
use crate::nodes;

/// Runs `redlock status`; returns the exit code.
pub fn status(args: &StatusArgs) -> Result<u8, Failure> {
    let locks = nodes::client(&args.nodes, |builder| builder)?;
    let resource = args.resource.as_str();
    if resource.is_empty() {
        return Err(Failure::usage("the resource name is empty"));
    }
    let seen = locks.inspect(resource)?;
    let answered = (seen.nodes.iter())
        .filter(|n| !matches!(n.holding, Holding::Unknown(_)))
        .count();
    let found = Found::new(&seen);
    let text = if args.nodes.json {
        as_json(resource, &seen, &found, answered)
    } else {
        as_text(resource, &seen, &found, answered)
    };
    print_line(text).map_err(|e| Failure::output(&e, "the status"))?;
    if found.held.is_none() {
        // The text's first line says so already; an object on standard
        // output is for a program, so people get it on standard error.
        if args.nodes.json {
            let total = seen.nodes.len();
            say(format_args!(
                "only {answered} of {total} nodes answered, fewer than a quorum of {}: \
                 whether `{resource}` is held cannot be told",
                seen.quorum
            ));
        }
        return Ok(exit::NODES);
    }
    Ok(0)
}

/// What a quorum says, with each holder that it names.
struct Found {
    /// `None`: cannot be told.
    held: Option<bool>,
    /// The holders' kind; `None` when free or unknown.
    kind: Option<Kind>,
    /// The holders on a quorum, in the verdict's order.
    holders: Vec<Summary>,
}

/// One holder on a quorum, gathered from the nodes that hold its token.
struct Summary {
    token: String,
    owner: Option<String>,
    /// The least time left on the nodes that hold it; `None`: it never
    /// expires there.
    ttl: Option<Duration>,
    /// On how many nodes.
    nodes: usize,
}

impl Found {
    fn new(seen: &Inspection) -> Found {
        let (held, kind, tokens) = match seen.verdict() {
            Verdict::Held { token, .. } => (Some(true), Some(Kind::Plain), vec![token]),
            Verdict::Shared { kind, tokens } => (Some(true), Some(kind), tokens),
            Verdict::Free => (Some(false), None, vec![]),
            _ => (None, None, vec![]),
        };
        let holders = tokens.iter().map(|t| summary(seen, t)).collect();
        Found {
            held,
            kind,
            holders,
        }
    }

    /// For a semaphore: its permits and how many are left.
    fn permits(&self) -> Option<(u32, usize)> {
        match self.kind {
            Some(Kind::Semaphore(k)) => Some((k, (k as usize).saturating_sub(self.holders.len()))),
            _ => None,
        }
    }
}

/// The holders on one node: one writer, or shared or counted holders.
fn holders_on(holding: &Holding) -> &[Holder] {
    match holding {
        Holding::Held(holder) => std::slice::from_ref(holder),
        Holding::Shared { holders, .. } => holders,
        _ => &[],
    }
}

/// `token`'s holder, from every node that holds it.
fn summary(seen: &Inspection, token: &str) -> Summary {
    let found: Vec<&Holder> = (seen.nodes.iter())
        .flat_map(|n| holders_on(&n.holding))
        .filter(|h| h.token == token)
        .collect();
    Summary {
        token: token.to_string(),
        owner: found.iter().find_map(|h| h.owner.clone()),
        ttl: found.iter().filter_map(|h| h.ttl).min(),
        nodes: found.len(),
    }
}

/// A kind's name in the output: an exclusive lock (plain or fenced),
/// `shared`, `semaphore`.
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Shared => "shared",
        Kind::Semaphore(_) => "semaphore",
        _ => "exclusive",
    }
}

/// A time left in milliseconds, for `--json`.
fn ms(ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
}

/// The `--json` output: one object.
fn as_json(resource: &str, seen: &Inspection, found: &Found, answered: usize) -> String {
    let exclusive = (found.kind == Some(Kind::Plain)).then(|| &found.holders[0]);
    let holders: Vec<Value> = (found.holders.iter())
        .map(|h| {
            json!({
                "token_prefix": h.token,
                "owner": h.owner,
                "ttl_ms": ms(h.ttl),
                "nodes": h.nodes,
            })
        })
        .collect();
    let nodes: Vec<Value> = seen.nodes.iter().map(node_json).collect();
    json!({
        "resource": resource,
        // null: cannot be told.
        "held": found.held,
        "kind": found.kind.map(kind_name),
        "token_prefix": exclusive.map(|h| &h.token),
        "owner": exclusive.and_then(|h| h.owner.as_ref()),
        "holders": holders,
        "permits": found.permits().map(|(k, _)| k),
        "permits_left": found.permits().map(|(_, left)| left),
        "quorum": seen.quorum,
        "answered": answered,
        "nodes": nodes,
    })
    .to_string()
}

/// The human output: the verdict, each holder on a quorum, then one line
/// per node.
fn as_text(resource: &str, seen: &Inspection, found: &Found, answered: usize) -> String {
    let (quorum, total) = (seen.quorum, seen.nodes.len());
    let mut text = match (found.held, found.kind, found.permits()) {
        (Some(true), Some(Kind::Plain), _) => {
            let h = &found.holders[0];
            format!(
                "`{resource}`: held, token {}...{}, on {} of {total} nodes (quorum {quorum})",
                h.token,
                owned(&h.owner, ", owner "),
                h.nodes
            )
        }
        (Some(true), _, Some((k, left))) => format!(
            "`{resource}`: semaphore of {k} permits, {} held, {left} left",
            found.holders.len()
        ),
        (Some(true), _, None) => format!(
            "`{resource}`: shared by {} reader(s), each on a quorum of nodes",
            found.holders.len()
        ),
        (Some(false), ..) => format!(
            "`{resource}`: not held (no token is on a quorum of {quorum} of {total} nodes)"
        ),
        (None, ..) => format!(
            "`{resource}`: unknown (only {answered} of {total} nodes answered, fewer than a quorum of {quorum})"
        ),
    };
    if found.kind.is_some_and(|k| k != Kind::Plain) {
        for h in &found.holders {
            let left = time_left(h.ttl);
            let owner = owned(&h.owner, "  owner ");
            let _ = write!(
                text,
                "\n  holder {}...{owner}  {left}  on {} of {total} nodes",
                h.token, h.nodes
            );
        }
    }
    let width = seen.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
    let mut above = String::new();
    for node in &seen.nodes {
        let line = node_line(node);
        // An error the node above had too is not said again.
        let shown = if line.starts_with("error: ") && line == above {
            "error: the same as above"
        } else {
            &line
        };
        let _ = write!(text, "\n  {:<width$}  {shown}", node.node);
        above = line;
    }
    text
}

/// `owner` after `before`, or nothing if the lock has no owner label.
fn owned(owner: &Option<String>, before: &str) -> String {
    owner
        .as_ref()
        .map_or_else(String::new, |o| format!("{before}{o}"))
}

/// A time left, for people.
fn time_left(ttl: Option<Duration>) -> String {
    match ttl {
        Some(left) => format!("{:.1}s left", left.as_secs_f64()),
        None => "never expires".to_string(),
    }
}

/// One node's line of the human output.
fn node_line(node: &NodeView) -> String {
    let one = |h: &Holder| {
        let owner = owned(&h.owner, ", ");
        format!("{}... ({}{owner})", h.token, time_left(h.ttl))
    };
    let mut line = match &node.holding {
        Holding::Free => "free".to_string(),
        Holding::Held(h) => format!("held by {}", one(h)),
        Holding::Shared { kind, holders } => {
            let all: Vec<String> = holders.iter().map(one).collect();
            match kind {
                Kind::Semaphore(k) => format!("semaphore of {k}: {}", all.join(", ")),
                _ => format!("shared by {}", all.join(", ")),
            }
        }
        Holding::Unknown(why) => return format!("error: {why}"),
        _ => "?".to_string(),
    };
    if let Some(fence) = node.fence {
        line.push_str(&format!("  fence {fence}"));
    }
    line
}

/// One node's entry of the JSON output.
fn node_json(node: &NodeView) -> Value {
    let (state, kind) = match &node.holding {
        Holding::Free => ("free", None),
        Holding::Held(_) => ("held", Some(Kind::Plain)),
        Holding::Shared { kind, .. } => ("held", Some(*kind)),
        Holding::Unknown(why) => {
            return json!({ "node": &*node.node, "state": "error", "error": why.to_string() })
        }
        _ => ("error", None),
    };
    let holders = holders_on(&node.holding);
    let writer = match &node.holding {
        Holding::Held(h) => Some(h),
        _ => None,
    };
    let holders: Vec<Value> = (holders.iter())
        .map(|h| json!({ "token_prefix": h.token, "owner": h.owner, "ttl_ms": ms(h.ttl) }))
        .collect();
    json!({
        "node": &*node.node,
        "state": state,
        "kind": kind.map(kind_name),
        "permits": match kind { Some(Kind::Semaphore(k)) => Some(k), _ => None },
        "token_prefix": writer.map(|h| &h.token),
        "owner": writer.and_then(|h| h.owner.as_ref()),
        "ttl_ms": writer.and_then(|h| ms(h.ttl)),
        "holders": holders,
        "fence": node.fence.map(|f| f.to_string()),
    })
}
