//! `redlock status`: what each node holds for a resource, read with the
//! tool's own read-only commands.
//!
//! The library has no read-only query of a lock (it only ever sets,
//! extends and deletes), so this opens its own connection to each node
//! through the `redis` crate and reads, in one `MULTI` so that the three
//! agree: the lock key (`GET`), its time left (`PTTL`), and the fencing
//! counter (`GET redlock-sync:fence:<resource>`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use redlock_sync::FENCE_KEY_PREFIX;
use serde_json::{json, Value};

use crate::args::StatusArgs;
use crate::exit::{self, print_line, say, Failure};
use crate::nodes;

/// How many characters of a token are shown: enough to tell holders
/// apart, too few to release the lock with.
const TOKEN_PREFIX: usize = 8;

/// What one node holds for the resource.
#[derive(Debug)]
struct Holding {
    /// The lock key's value: the holder's token.
    token: Option<String>,
    /// Its time left; `None` if it never expires (not a lock this tool
    /// would set).
    left: Option<Duration>,
    /// The fencing counter, if the resource was ever locked fenced here.
    fence: Option<String>,
}

/// Runs `redlock status`; returns the exit code.
pub fn status(args: &StatusArgs) -> Result<u8, Failure> {
    // The client checks the URLs (and that no server is listed twice) and
    // gives the nodes' printable names; it connects to nothing.
    let locks = nodes::client(&args.nodes, |builder| builder)?;
    let urls = nodes::urls(&args.nodes)?;
    let resource = args.resource.as_str();
    if resource.is_empty() {
        return Err(Failure::usage("the resource name is empty"));
    }
    let (connect, io) = (args.nodes.connect_timeout, args.nodes.io_timeout);
    // Side by side, so a dead node costs its timeout once, not once each.
    let holdings: Vec<Result<Holding, String>> = std::thread::scope(|s| {
        let threads: Vec<_> = urls
            .iter()
            .map(|url| {
                std::thread::Builder::new()
                    .name("redlock-status".into())
                    .spawn_scoped(s, move || read(url, resource, connect, io))
            })
            .collect();
        threads
            .into_iter()
            .zip(&urls)
            .map(|(thread, url)| match thread {
                Ok(thread) => thread
                    .join()
                    .unwrap_or_else(|_| Err("reading it failed".to_string())),
                Err(_) => read(url, resource, connect, io),
            })
            .collect()
    });

    let names = locks.nodes();
    let quorum = locks.quorum();
    let answered = holdings.iter().filter(|h| h.is_ok()).count();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for token in holdings.iter().flatten().filter_map(|h| h.token.as_deref()) {
        *counts.entry(token).or_default() += 1;
    }
    let top = counts.into_iter().max_by_key(|(_, n)| *n);
    let holder = top
        .filter(|(_, n)| *n >= quorum)
        .map(|(token, _)| prefix(token));
    // "Not held" needs a quorum of answers: with fewer, the nodes that did
    // not answer may hold a token that makes a quorum with some that did.
    // ("Held" needs a quorum of answers anyway.)
    let known = answered >= quorum;

    let text = if args.nodes.json {
        let nodes: Vec<Value> = names
            .iter()
            .zip(&holdings)
            .map(|(name, holding)| node_json(name, holding))
            .collect();
        let out = json!({
            "resource": resource,
            // null: cannot be told.
            "held": known.then_some(holder.is_some()),
            "token_prefix": holder,
            "quorum": quorum,
            "answered": answered,
            "nodes": nodes,
        });
        out.to_string()
    } else {
        let mut text = String::new();
        match holder {
            Some(token) => writeln!(
                text,
                "`{resource}`: held, token {token}..., on {} of {} nodes (quorum {quorum})",
                top.map_or(0, |(_, n)| n),
                names.len()
            ),
            None if known => writeln!(
                text,
                "`{resource}`: not held (no token is on a quorum of {quorum} of {} nodes)",
                names.len()
            ),
            None => writeln!(
                text,
                "`{resource}`: unknown (only {answered} of {} nodes answered, fewer than a quorum of {quorum})",
                names.len()
            ),
        }
        .ok();
        let width = names.iter().map(|n| n.len()).max().unwrap_or(0);
        for (name, holding) in names.iter().zip(&holdings) {
            let _ = writeln!(text, "  {name:<width$}  {}", node_line(holding));
        }
        text.truncate(text.trim_end().len());
        text
    };
    print_line(text).map_err(|e| Failure::output(&e, "the status"))?;
    if !known {
        say(format_args!(
            "only {answered} of {} nodes answered, fewer than a quorum of {quorum}: \
             whether `{resource}` is held cannot be told",
            names.len()
        ));
        return Ok(exit::NODES);
    }
    Ok(0)
}

/// Reads what the node at `url` holds for `resource`, within the timeouts.
fn read(url: &str, resource: &str, connect: Duration, io: Duration) -> Result<Holding, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client
        .get_connection_with_timeout(connect)
        .map_err(|e| format!("connect: {e}"))?;
    con.set_read_timeout(Some(io))
        .and_then(|()| con.set_write_timeout(Some(io)))
        .map_err(|e| e.to_string())?;
    let (token, pttl, fence): (Option<Vec<u8>>, i64, Option<String>) = redis::pipe()
        .atomic()
        .cmd("GET")
        .arg(resource)
        .cmd("PTTL")
        .arg(resource)
        .cmd("GET")
        .arg(format!("{FENCE_KEY_PREFIX}{resource}"))
        .query(&mut con)
        .map_err(|e| e.to_string())?;
    Ok(Holding {
        token: token.map(|t| String::from_utf8_lossy(&t).into_owned()),
        // PTTL: -2 no key, -1 no expiry, else milliseconds left.
        left: u64::try_from(pttl).ok().map(Duration::from_millis),
        fence,
    })
}

/// The first characters of a token.
fn prefix(token: &str) -> String {
    token.chars().take(TOKEN_PREFIX).collect()
}

/// One node's line of the human output.
fn node_line(holding: &Result<Holding, String>) -> String {
    let holding = match holding {
        Ok(holding) => holding,
        Err(e) => return format!("error: {e}"),
    };
    let mut line = match (&holding.token, holding.left) {
        (None, _) => "free".to_string(),
        (Some(token), Some(left)) => format!(
            "held by {}...  {:.1}s left",
            prefix(token),
            left.as_secs_f64()
        ),
        (Some(token), None) => format!("held by {}...  never expires", prefix(token)),
    };
    if let Some(fence) = &holding.fence {
        line.push_str(&format!("  fence {fence}"));
    }
    line
}

/// One node's entry of the JSON output.
fn node_json(name: &str, holding: &Result<Holding, String>) -> Value {
    match holding {
        Err(e) => json!({ "node": name, "state": "error", "error": e }),
        Ok(holding) => json!({
            "node": name,
            "state": if holding.token.is_some() { "held" } else { "free" },
            "token_prefix": holding.token.as_deref().map(prefix),
            "ttl_ms": holding.left.map(|left| left.as_millis() as u64),
            "fence": holding.fence,
        }),
    }
}
