//! `redlock status`: what each node holds for a resource, read with the
//! library's read-only [`inspect`](redlock_sync::Redlock::inspect). It goes
//! through the library's connections and checks: a server named twice
//! answers once, the restart grace, the timeouts.
//!
//! A resource is free, held by one exclusive holder (a plain or fenced
//! lock), by shared or counted holders (`--shared`, `--semaphore K`), or by
//! an application's key that is not a lock. Each holder shows its token's
//! first 8 characters, its owner label and its time left. Each holder
//! counts against its own kind's quorum (a semaphore's exceeds the
//! writers'). A waiting writer's intent shows too.

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
    let verdict = seen.verdict();
    let text = if args.nodes.json {
        as_json(&seen, &verdict)
    } else {
        as_text(&seen, &verdict)
    };
    print_line(text).map_err(|e| Failure::output(&e, "the status"))?;
    if let Verdict::Unknown { quorum } = verdict {
        // The text's first line says so already; an object on standard
        // output is for a program, so people get it on standard error.
        if args.nodes.json {
            say(format_args!(
                "{}: whether `{resource}` is held cannot be told",
                unknown(&seen, quorum)
            ));
        }
        return Ok(exit::NODES);
    }
    Ok(0)
}

/// How many nodes answered.
fn answered(seen: &Inspection) -> usize {
    seen.nodes
        .iter()
        .filter(|n| !matches!(n.holding, Holding::Unknown(_)))
        .count()
}

/// Why the verdict is unknown: the silent nodes could complete `quorum`.
fn unknown(seen: &Inspection, quorum: usize) -> String {
    let answered = answered(seen);
    let total = seen.nodes.len();
    if answered < quorum {
        format!("only {answered} of {total} nodes answered, fewer than a quorum of {quorum}")
    } else {
        let silent = total - answered;
        format!("{silent} of {total} nodes did not answer, enough to complete a quorum of {quorum}")
    }
}

/// For a semaphore: its permits and how many are left.
fn permits(verdict: &Verdict) -> Option<(u32, usize)> {
    match verdict {
        Verdict::Shared {
            kind: Kind::Semaphore(k),
            count,
            ..
        } => Some((*k, (*k as usize).saturating_sub(*count))),
        _ => None,
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

/// The verdict's kind in the output; `not_a_lock` for an application's
/// key.
fn verdict_kind(verdict: &Verdict) -> Option<&'static str> {
    match verdict {
        Verdict::Held { .. } => Some(kind_name(Kind::Plain)),
        Verdict::Shared { kind, .. } => Some(kind_name(*kind)),
        Verdict::NotALock { .. } => Some("not_a_lock"),
        _ => None,
    }
}

/// A Redis type for people: `zset` is a sorted set.
fn type_name(redis_type: &str) -> &str {
    match redis_type {
        "zset" => "sorted set",
        other => other,
    }
}

/// A time left in milliseconds, for `--json`.
fn ms(ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
}

/// The `--json` output: one object. `quorum` is the holders' kind's, and
/// `writer_quorum` the writers', where they differ.
fn as_json(seen: &Inspection, verdict: &Verdict) -> String {
    let exclusive = match verdict {
        Verdict::Held { holder, .. } => Some(holder),
        _ => None,
    };
    let holders: Vec<Value> = (verdict.holders().iter())
        .map(|h| {
            json!({
                "token_prefix": h.token,
                "owner": h.owner,
                "ttl_ms": ms(h.ttl),
                "nodes": h.nodes,
            })
        })
        .collect();
    let count = match verdict {
        Verdict::Shared { count, .. } => *count,
        _ => holders.len(),
    };
    let held = match verdict {
        Verdict::Free => Some(false),
        Verdict::Unknown { .. } => None,
        _ => Some(true),
    };
    let redis_type = match verdict {
        Verdict::NotALock { redis_type, .. } => Some(redis_type),
        _ => None,
    };
    let quorum = verdict.quorum().unwrap_or(seen.quorum);
    let nodes: Vec<Value> = seen.nodes.iter().map(node_json).collect();
    let mut out = json!({
        "resource": seen.resource,
        // null: cannot be told.
        "held": held,
        "kind": verdict_kind(verdict),
        "redis_type": redis_type,
        "token_prefix": exclusive.map(|h| &h.token),
        "owner": exclusive.and_then(|h| h.owner.as_ref()),
        "holders": holders,
        "holder_count": count,
        "permits": permits(verdict).map(|(k, _)| k),
        "permits_left": permits(verdict).map(|(_, left)| left),
        "quorum": quorum,
        "intent_ms": ms(seen.intent()),
        "answered": answered(seen),
        "nodes": nodes,
    });
    if quorum != seen.quorum {
        out["writer_quorum"] = json!(seen.quorum);
    }
    out.to_string()
}

/// The first line of the human output: what a quorum says.
fn headline(seen: &Inspection, verdict: &Verdict) -> String {
    let resource = &seen.resource;
    let total = seen.nodes.len();
    match verdict {
        Verdict::Held { holder, quorum } => format!(
            "`{resource}`: held, token {}...{}, on {} of {total} nodes (quorum {quorum})",
            holder.token,
            owned(&holder.owner, ", owner "),
            holder.nodes
        ),
        Verdict::Shared { count, quorum, .. } => match permits(verdict) {
            Some((k, left)) => format!(
                "`{resource}`: semaphore of {k} permits, {count} held, {left} left, \
                 each on a quorum of {quorum} of {total} nodes"
            ),
            None => format!(
                "`{resource}`: shared by {count} reader(s), each on a quorum of {quorum} of {total} nodes"
            ),
        },
        Verdict::NotALock {
            redis_type, nodes, ..
        } => format!(
            "`{resource}`: held by an application's {} (not a lock), on {nodes} of {total} nodes",
            type_name(redis_type)
        ),
        Verdict::Unknown { quorum } => format!("`{resource}`: unknown ({})", unknown(seen, *quorum)),
        _ => format!("`{resource}`: not held (no holder is on its quorum of the {total} nodes)"),
    }
}

/// The human output: the verdict, each shared or counted holder, a
/// waiting writer, then one line per node.
fn as_text(seen: &Inspection, verdict: &Verdict) -> String {
    let total = seen.nodes.len();
    let mut text = headline(seen, verdict);
    if let Verdict::Shared { holders, count, .. } = verdict {
        for h in holders {
            let left = time_left(h.ttl);
            let owner = owned(&h.owner, "  owner ");
            let _ = write!(
                text,
                "\n  holder {}...{owner}  {left}  on {} of {total} nodes",
                h.token, h.nodes
            );
        }
        if *count > holders.len() {
            let _ = write!(text, "\n  and {} more", count - holders.len());
        }
    }
    if let Some(left) = seen.intent() {
        let left = time_left(Some(left));
        let _ = write!(
            text,
            "\n  new readers held back for a waiting writer, {left}"
        );
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
        Some(Duration::MAX) | None => "never expires".to_string(),
        Some(left) => format!("{:.1}s left", left.as_secs_f64()),
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

/// One node's line of the human output.
fn node_line(node: &NodeView) -> String {
    let one = |h: &Holder| {
        let owner = owned(&h.owner, ", ");
        format!("{}... ({}{owner})", h.token, time_left(h.ttl))
    };
    let mut line = match &node.holding {
        Holding::Free => "free".to_string(),
        Holding::Held(h) => format!("held by {}", one(h)),
        Holding::Shared { kind, holders, .. } => {
            let all: Vec<String> = holders.iter().map(one).collect();
            match kind {
                Kind::Semaphore(k) => format!("semaphore of {k}: {}", all.join(", ")),
                _ => format!("shared by {}", all.join(", ")),
            }
        }
        Holding::NotALock { redis_type } => {
            format!("an application's {} (not a lock)", type_name(redis_type))
        }
        Holding::Unknown(why) => return format!("error: {why}"),
        _ => "?".to_string(),
    };
    if let Some(fence) = node.fence {
        line.push_str(&format!("  fence {fence}"));
    }
    if let Some(left) = node.intent {
        line.push_str(&format!("  a writer waits ({})", time_left(Some(left))));
    }
    line
}

/// One node's entry of the JSON output.
fn node_json(node: &NodeView) -> Value {
    let (state, kind) = match &node.holding {
        Holding::Free => ("free", None),
        Holding::Held(_) => ("held", Some(kind_name(Kind::Plain))),
        Holding::Shared { kind, .. } => ("held", Some(kind_name(*kind))),
        Holding::NotALock { .. } => ("held", Some("not_a_lock")),
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
    let redis_type = match &node.holding {
        Holding::NotALock { redis_type } => Some(redis_type),
        _ => None,
    };
    let permits = match &node.holding {
        Holding::Shared {
            kind: Kind::Semaphore(k),
            ..
        } => Some(k),
        _ => None,
    };
    let holders: Vec<Value> = (holders.iter())
        .map(|h| json!({ "token_prefix": h.token, "owner": h.owner, "ttl_ms": ms(h.ttl) }))
        .collect();
    json!({
        "node": &*node.node,
        "state": state,
        "kind": kind,
        "redis_type": redis_type,
        "permits": permits,
        "token_prefix": writer.map(|h| &h.token),
        "owner": writer.and_then(|h| h.owner.as_ref()),
        "ttl_ms": writer.and_then(|h| ms(h.ttl)),
        "holders": holders,
        "fence": node.fence.map(|f| f.to_string()),
        "intent_ms": ms(node.intent),
    })
}
