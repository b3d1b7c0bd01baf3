//! `redlock acquire`, `extend` and `release`: a lock taken and given back
//! in separate steps, by its resource and token (the library's explicit
//! tokens, across processes).

use std::time::Duration;

use redlock_sync::{Kind, Lock, LockOptions, Redlock, Token};
use serde_json::json;

use crate::args::{AcquireArgs, ExtendArgs, LockRef, NodeArgs, ReleaseArgs};
use crate::events::Events;
use crate::exit::{millis, nodes_json, Failure};
use crate::nodes;
use crate::wait::{keep_trying, Patience};

/// Runs `redlock acquire`: prints the token; returns the exit code.
pub fn acquire(args: &AcquireArgs) -> Result<u8, Failure> {
    let take = &args.acquisition;
    let locks = nodes::client(&args.nodes, |builder| builder.retry_count(0))?;
    let events = Events::listen()?;
    let resource = args.resource.as_str();
    let lock = keep_trying(&Patience::new(take), &events, resource, || {
        locks
            .try_acquire(resource, LockOptions::new(take.ttl).kind(kind(take.fenced)))
            .into()
    })?;
    if let Some(signal) = events.pending_stop() {
        // Asked to stop while the last attempt ran: nobody will see the token.
        let _ = locks.release(lock);
        return Err(Failure::interrupted(signal, "while taking the lock"));
    }
    if args.nodes.json {
        let out = json!({
            "resource": resource,
            "token": lock.token().to_string(),
            "fencing_token": lock.fencing_token(),
            "validity_ms": millis(lock.validity()),
            "nodes": nodes_json(lock.report()),
        });
        println!("{out}");
    } else {
        match lock.fencing_token() {
            Some(fencing) => println!("{} {fencing}", lock.token()),
            None => println!("{}", lock.token()),
        }
    }
    Ok(0)
}

/// Runs `redlock extend`; returns the exit code.
pub fn extend(args: &ExtendArgs) -> Result<u8, Failure> {
    let (locks, mut lock) = rebuilt(&args.nodes, &args.lock)?;
    locks.extend(&mut lock, args.ttl)?;
    if args.nodes.json {
        let out = json!({
            "resource": args.lock.resource,
            "validity_ms": millis(lock.validity()),
            "nodes": nodes_json(lock.report()),
        });
        println!("{out}");
    }
    Ok(0)
}

/// Runs `redlock release`; returns the exit code.
pub fn release(args: &ReleaseArgs) -> Result<u8, Failure> {
    let (locks, lock) = rebuilt(&args.nodes, &args.lock)?;
    let report = locks.release(lock)?;
    if args.nodes.json {
        let out = json!({
            "resource": args.lock.resource,
            "released": true,
            "nodes": nodes_json(&report),
        });
        println!("{out}");
    }
    Ok(0)
}

/// The client, and the lock that `named` names.
fn rebuilt(nodes: &NodeArgs, named: &LockRef) -> Result<(Redlock, Lock), Failure> {
    let token: Token = named.token.parse().map_err(|e| {
        Failure::usage(format_args!(
            "bad token (give the one `redlock acquire` printed): {e}"
        ))
    })?;
    // Set here rather than left to the library's defaults: `extend --help`
    // promises this policy.
    let locks = nodes::client(nodes, |builder| {
        builder
            .retry_count(3)
            .retry_delay(Duration::from_millis(200))
            .retry_jitter(Duration::from_millis(100))
    })?;
    let lock = Lock::from_token(named.resource.as_str(), token, Kind::Plain)?;
    Ok((locks, lock))
}

/// The kind of lock `--fenced` asks for.
pub fn kind(fenced: bool) -> Kind {
    if fenced {
        Kind::Fenced
    } else {
        Kind::Plain
    }
}
