//! `redlock acquire`, `extend` and `release`: a lock taken and given back
//! in separate steps, by its resource and token (the library's explicit
//! tokens, across processes).

use std::time::Duration;

use redlock_sync::{Kind, Lock, Redlock, Token};
use serde_json::json;

use crate::args::{AcquireArgs, ExtendArgs, LockRef, NodeArgs, ReleaseArgs};
use crate::events::{Events, Role};
use crate::exit::{millis, nodes_json, print_line, Failure};
use crate::nodes;
use crate::wait::{keep_trying, paced, warn_refusals, Form, WaitPlan};

/// Runs `redlock acquire`: prints the token; returns the exit code.
pub fn acquire(args: &AcquireArgs) -> Result<u8, Failure> {
    // Before anything opens a file: with standard output closed, the
    // first one opened would take its place, and get the token.
    stdout_is_open()?;
    let take = &args.acquisition;
    let locks = nodes::client(&args.nodes, |builder| paced(builder, take))?;
    let events = Events::listen(Role::Tool)?;
    let resource = args.resource.as_str();
    let plan = WaitPlan::new(take, caller());
    // The library's wait, which a signal cancels and a release wakes.
    let lock = keep_trying(&plan, &events, resource, |form| match form {
        Form::Once(options) => locks.try_acquire(resource, options),
        Form::Wait(options) => locks.acquire(resource, options),
    })?;
    warn_refusals(lock.report());
    if let Some(signal) = events.pending_stop() {
        // Asked to stop while the last attempt ran: nobody will see the token.
        let _ = locks.release(lock);
        return Err(Failure::interrupted(signal, "while taking the lock"));
    }
    let out = if args.nodes.json {
        json!({
            "resource": resource,
            "token": lock.token().to_string(),
            "kind": kind_name(lock.kind()),
            "permits": permits(lock.kind()),
            "owner": plan.owner(),
            "fencing_token": lock.fencing_token(),
            "validity_ms": millis(lock.validity()),
            "nodes": nodes_json(lock.report()),
        })
        .to_string()
    } else {
        match lock.fencing_token() {
            Some(fencing) => format!("{} {fencing}", lock.token()),
            None => lock.token().to_string(),
        }
    };
    if let Err(e) = print_line(out) {
        // Nobody got the token: nobody could release the lock.
        let released = match locks.release(lock) {
            Ok(_) => "the lock was released",
            Err(_) => "releasing the lock failed: it expires after --ttl",
        };
        return Err(Failure::output(&e, "the token").then(released));
    }
    Ok(0)
}

/// The pid of the process that holds a lock that `acquire` takes: the
/// shell or program that called it. The tool itself exits at once.
/// Elsewhere than on Unix, where no parent pid is at hand, the tool's own.
fn caller() -> u32 {
    #[cfg(unix)]
    let pid = std::os::unix::process::parent_id();
    #[cfg(not(unix))]
    let pid = std::process::id();
    pid
}

/// Fails with [`crate::exit::OUTPUT`] if standard output is closed: a token
/// printed nowhere would leave a lock that nobody can release.
///
/// The standard library puts `/dev/null`, opened for reading and writing,
/// in place of a standard descriptor closed at start (`>&-`). `> /dev/null`
/// opens it for writing only, and is taken at its word.
fn stdout_is_open() -> Result<(), Failure> {
    #[cfg(unix)]
    {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use nix::sys::stat::{fstat, stat};
        let stdout = std::io::stdout();
        let closed = match fcntl(&stdout, FcntlArg::F_GETFL) {
            Err(_) => true,
            Ok(flags) => {
                let read_write =
                    OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE == OFlag::O_RDWR;
                let null = match (fstat(&stdout), stat("/dev/null")) {
                    (Ok(out), Ok(null)) => {
                        out.st_rdev == null.st_rdev && out.st_mode == null.st_mode
                    }
                    _ => false,
                };
                read_write && null
            }
        };
        if closed {
            return Err(Failure::new(
                crate::exit::OUTPUT,
                "output",
                "standard output is closed: the token would be printed nowhere; no lock was taken",
            ));
        }
    }
    Ok(())
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
        print_line(out).map_err(|e| Failure::output(&e, "the result"))?;
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
        print_line(out).map_err(|e| Failure::output(&e, "the result"))?;
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
        builder.retry_policy(
            redlock_sync::RetryPolicy::default()
                .retries(3)
                .delay(Duration::from_millis(200))
                .jitter(Duration::from_millis(100)),
        )
    })?;
    let lock = Lock::from_token(named.resource.as_str(), token, named.kind.kind())?;
    Ok((locks, lock))
}

/// A semaphore's permits, for `--json` output; `None` for other kinds.
fn permits(kind: Kind) -> Option<u32> {
    match kind {
        Kind::Semaphore(k) => Some(k),
        _ => None,
    }
}

/// A kind's name in `--json` output: `plain`, `fenced`, `shared`,
/// `semaphore`.
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Fenced => "fenced",
        Kind::Shared => "shared",
        Kind::Semaphore(_) => "semaphore",
        _ => "plain",
    }
}
