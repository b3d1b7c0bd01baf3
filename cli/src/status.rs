//! `redlock status`: what each node holds for a resource, read with the
//! library's read-only [`inspect`](redlock_sync::Redlock::inspect). It goes
//! through the library's connections and checks: a server named twice
//! answers once, the restart grace, the timeouts.

use std::fmt::Write as _;

use redlock_sync::{Holding, Inspection, NodeView, Verdict};
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
    let text = if args.nodes.json {
        as_json(resource, &seen, answered)
    } else {
        as_text(resource, &seen, answered)
    };
    print_line(text).map_err(|e| Failure::output(&e, "the status"))?;
    if !matches!(seen.verdict(), Verdict::Held { .. } | Verdict::Free) {
        let (quorum, total) = (seen.quorum, seen.nodes.len());
        say(format_args!(
            "only {answered} of {total} nodes answered, fewer than a quorum of {quorum}: \
             whether `{resource}` is held cannot be told"
        ));
        return Ok(exit::NODES);
    }
    Ok(0)
}

/// The `--json` output: one object.
fn as_json(resource: &str, seen: &Inspection, answered: usize) -> String {
    let (held, token) = match seen.verdict() {
        Verdict::Held { token, .. } => (Some(true), Some(token)),
        Verdict::Free => (Some(false), None),
        _ => (None, None),
    };
    let nodes: Vec<Value> = seen.nodes.iter().map(node_json).collect();
    json!({
        "resource": resource,
        // null: cannot be told.
        "held": held,
        "token_prefix": token,
        "quorum": seen.quorum,
        "answered": answered,
        "nodes": nodes,
    })
    .to_string()
}

/// The human output: the verdict, then one line per node.
fn as_text(resource: &str, seen: &Inspection, answered: usize) -> String {
    let (quorum, total) = (seen.quorum, seen.nodes.len());
    let mut text = match seen.verdict() {
        Verdict::Held { token, nodes } => format!(
            "`{resource}`: held, token {token}..., on {nodes} of {total} nodes (quorum {quorum})"
        ),
        Verdict::Free => format!(
            "`{resource}`: not held (no token is on a quorum of {quorum} of {total} nodes)"
        ),
        _ => format!(
            "`{resource}`: unknown (only {answered} of {total} nodes answered, fewer than a quorum of {quorum})"
        ),
    };
    let width = seen.nodes.iter().map(|n| n.node.len()).max().unwrap_or(0);
    for node in &seen.nodes {
        let _ = write!(text, "\n  {:<width$}  {}", node.node, node_line(node));
    }
    text
}

/// One node's line of the human output.
fn node_line(node: &NodeView) -> String {
    let mut line = match &node.holding {
        Holding::Free => "free".to_string(),
        Holding::Held(h) => match h.ttl {
            Some(left) => format!("held by {}...  {:.1}s left", h.token, left.as_secs_f64()),
            None => format!("held by {}...  never expires", h.token),
        },
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
    let (state, token, ttl) = match &node.holding {
        Holding::Free => ("free", None, None),
        Holding::Held(h) => ("held", Some(&h.token), h.ttl.map(|t| t.as_millis() as u64)),
        Holding::Unknown(why) => {
            return json!({ "node": &*node.node, "state": "error", "error": why.to_string() })
        }
        _ => ("error", None, None),
    };
    json!({
        "node": &*node.node,
        "state": state,
        "token_prefix": token,
        "ttl_ms": ttl,
        "fence": node.fence.map(|f| f.to_string()),
    })
}
