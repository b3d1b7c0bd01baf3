//! Distributed locks over N independent Redis (or Valkey) masters, following
//! the Redlock algorithm: synchronous, with no async runtime, and one network
//! round trip per quorum round.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_sync::Redlock;
//!
//! let locks = Redlock::new([
//!     "redis://127.0.0.1:7001",
//!     "redis://127.0.0.1:7002",
//!     "redis://127.0.0.1:7003",
//!     "redis://127.0.0.1:7004",
//!     "redis://127.0.0.1:7005",
//! ])?;
//!
//! let lock = locks.acquire("invoice:42", Duration::from_secs(10))?;
//! // Work only while lock.validity() is comfortably above zero.
//! locks.release(lock)?;
//! # Ok::<(), redlock_sync::LockError>(())
//! ```
//!
//! # How it works
//!
//! A [`Redlock`] holds the node URLs, the settings, and one connection per
//! node that all threads share; share the client between threads (it is
//! `Clone`, `Send` and `Sync`). Every operation is a *round*: the same
//! command goes to every node, written to all of them first, and only then
//! are the replies read, against a single deadline (`io_timeout` after the
//! round began). A round therefore costs about one round trip, and a dead or
//! hung node costs at most `io_timeout`. Reading stops as soon as the
//! outcome is decided (a quorum granted, or can no longer grant); the other
//! replies are read and discarded later ([`NodeOutcome::NotAwaited`]).
//! Threads that meet another thread writing a connection leave their
//! commands in its outbox, and the writer writes them all in one write;
//! writing never waits for a thread that is reading.
//!
//! - [`acquire`](Redlock::acquire) sends `SET resource token NX PX ttl` to
//!   every node. The lock is granted when a quorum (`N / 2 + 1`) set the key
//!   and some validity is left: `validity = ttl - elapsed - (ttl *
//!   drift_factor + 2 ms)`, measured on the monotonic clock from just before
//!   the first write. Otherwise it releases on every node (also the ones
//!   that failed: the `SET` may have landed though its reply was lost) and
//!   tries again after a random pause, up to the retry count.
//!   [`try_acquire`](Redlock::try_acquire) runs one round only.
//! - [`extend`](Redlock::extend) and [`release`](Redlock::release) run Lua
//!   scripts that touch the key only if it still holds our token; a plain
//!   `DEL` could delete another client's lock. Each new connection loads
//!   the scripts, so they go as `EVALSHA`, with a fallback to `EVAL` inside
//!   the same round if a server lost them.
//! - Any error or timeout on a connection throws that connection away, for
//!   every thread that shared it: a connection with a reply still in flight
//!   is never reused, and replies are matched to requests by sequence
//!   number, so a late `OK` can never be mistaken for a grant.
//! - Every acquisition takes several resources as well as one
//!   ([`IntoResources`]): one lock, all or nothing on each node (one Lua
//!   script sets every key only if none is held); `extend` and `release`
//!   then act on all of them.
//! - The [`RetryPolicy`] plans every pause; a call's [`Patience`] says how
//!   long it waits (by default the retry count, within
//!   [`max_wait`](RedlockBuilder::max_wait)); a [`Cancel`] handle ends a
//!   wait from another thread; errors that waiting cannot fix (a wrong
//!   password, a missing ACL permission, TLS, a host that does not exist)
//!   end every wait at once ([`LockError::Unusable`]).
//! - A waiting `acquire` does not sleep out its pause blindly: the release
//!   script also `PUBLISH`es on the resource's channel (no extra round
//!   trip), a client's waiting threads share one subscription connection to
//!   one node, and a waiter retries as soon as it hears of a release, or
//!   when its pause ends. A release through the same client wakes its own
//!   waiter without the network. These are hints: safety never depends on
//!   them, and there is no fairness or FIFO order.
//!
//! # Scoped locking: `with_lock` and `lock`
//!
//! [`with_lock`](Redlock::with_lock) acquires, runs a closure, and always
//! releases (on return, on error, on panic). Meanwhile the client's one
//! watchdog thread (for all its guards, in shared rounds) extends the lock
//! each time a third of its validity is left, so the
//! closure may run far longer than the TTL. The closure gets a
//! [`LockGuard`] whose [`check`](LockGuard::check) fails as soon as the
//! lock is lost; and if it was lost at any moment, `with_lock` returns the
//! lost-lock error even when the closure returned `Ok`.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use redlock_sync::{LockError, Redlock};
//! # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
//! let rows = locks.with_lock("nightly-report", Duration::from_secs(10), |guard| {
//!     let mut rows = 0;
//!     for _batch in 0..1_000 {
//!         guard.check()?; // stop at once if the lock was lost
//!         rows += 1; // ... one batch of work, however long it all takes ...
//!     }
//!     Ok::<_, LockError>(rows)
//! })?;
//! # Ok::<(), LockError>(())
//! ```
//!
//! For code that does not fit in a closure, [`lock`](Redlock::lock) returns
//! the same guard, kept alive by the same watchdog: the lock is released
//! when the guard is dropped (at the end of its scope, on an early return
//! or `?`, while a panic unwinds), or by [`unlock`](LockGuard::unlock),
//! which says whether it was held throughout.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use redlock_sync::{LockError, Redlock};
//! # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
//! let guard = locks.lock("nightly-report", Duration::from_secs(10))?;
//! for _batch in 0..1_000 {
//!     guard.check()?; // lost: return, and the guard's drop releases
//! }
//! guard.unlock()?;
//! # Ok::<(), LockError>(())
//! ```
//!
//! Each has its `try_` form for one attempt with no retry
//! ([`try_with_lock`](Redlock::try_with_lock), [`try_lock`](Redlock::try_lock)).
//!
//! # Watching locks
//!
//! [`LockGuard::wait_lost`] blocks until the lock is lost, and
//! [`LockGuard::on_lost`] runs a callback then, on the client's notifier
//! thread. [`RedlockBuilder::observer`] hands acquisitions, node failures
//! and recoveries, extensions, losses and releases to your logs and
//! metrics as an [`Event`], once per change, with a count of failed rounds.
//! [`Redlock::inspect`] reads, without writing, what each node holds for a
//! resource and what a quorum says ([`Verdict`]).
//!
//! ```no_run
//! # use std::time::Duration;
//! # use redlock_sync::{LockError, Redlock, Verdict};
//! let locks = Redlock::builder(["redis://127.0.0.1:7001"])
//!     .observer(|event| eprintln!("redlock: {event:?}"))
//!     .build()?;
//! locks.with_lock("leader", Duration::from_secs(10), |guard| {
//!     guard.on_lost(|e| eprintln!("stepping down: {e}"));
//!     while !guard.wait_lost(Duration::from_secs(1)) { /* lead */ }
//!     Ok::<(), LockError>(())
//! })
//! .ok();
//! assert!(matches!(locks.inspect("leader")?.verdict(), Verdict::Free | Verdict::Unknown));
//! # Ok::<(), LockError>(())
//! ```
//!
//! # One door per operation
//!
//! Six methods acquire: [`acquire`](Redlock::acquire) and
//! [`try_acquire`](Redlock::try_acquire) (a [`Lock`]), `lock` and
//! `try_lock` (a guard), `with_lock` and `try_with_lock` (a closure). Each
//! takes what to lock (one resource or several, see [`IntoResources`]) and
//! how: a [`LockOptions`], of which a bare `Duration` is the TTL alone. The
//! options carry the [`Kind`] of lock (plain, or fenced with a fencing
//! token), the [`Patience`] of the waiting forms, a guard's hold cap and
//! extension point, and a [`Cancel`] handle; what they leave unset comes
//! from the client's builder.
//!
//! ```no_run
//! # use std::time::Duration;
//! use redlock_sync::{Cancel, Kind, LockOptions, Patience, Redlock};
//!
//! # let locks = Redlock::new(["redis://127.0.0.1:7001"])?;
//! let shutdown = Cancel::new(); // shutdown.cancel() from a signal-handling thread
//! let leader = LockOptions::new(Duration::from_secs(10))
//!     .kind(Kind::Fenced)
//!     .patience(Patience::Forever)
//!     .cancel(&shutdown);
//! let guard = locks.lock("leader", leader)?; // Err(Cancelled) once cancelled
//! let job = locks.try_acquire(["job:17", "job:18"], Duration::from_secs(30)); // one attempt
//! # Ok::<(), redlock_sync::LockError>(())
//! ```
//!
//! A [`Token`] is 160 random bits from the operating system. A lock acquired
//! in one process can be released or extended in another that knows only
//! its resource and token: see [`Lock::from_token`].
//!
//! Every operation reports what each node answered: [`Lock::report`] after
//! success, [`LockError::report`] after failure. Errors say what to do in
//! their message (`Display`); a node that refuses the URL's password, or
//! asks for one, fails with [`NodeError::Auth`].
//!
//! # Node URLs
//!
//! `redis://[user:password@]host:port[/db]` (a password alone goes after a
//! colon: `redis://:password@host:port`), `redis+unix:///path?db=N&pass=P`,
//! and with the `tls` feature `rediss://`; `valkey://`, `valkey+unix://`
//! and `valkeys://` are the same. A URL that does not parse is refused
//! with [`ConfigError::NodeUrl`], which names the part that is wrong; no
//! message or `Debug` output of this crate shows a password.
//!
//! # What a lease-based lock can and cannot promise
//!
//! A Redlock lock is a *lease*: it is yours until its validity runs out,
//! whether or not you are done. If the holder pauses (a long GC, swapping,
//! `SIGSTOP`, a VM migration) past its validity and then writes, another
//! client may have taken the lock in between, and both write. No client
//! library can prevent that.
//!
//! - For **efficiency** (avoid doing the same work twice, avoid a thundering
//!   herd), Redlock is a good fit: a rare overlap costs some duplicate work.
//! - For **correctness** (two writers corrupt data), the protected resource
//!   must itself reject stale holders: a fencing token checked by the
//!   resource, or a consensus system (etcd, ZooKeeper) with a transaction
//!   that includes the check. This crate gives fencing tokens:
//!   [`Kind::Fenced`] (where the safety argument is), with any of the
//!   doors. Check
//!   [`Lock::validity`] before each write, and treat [`LockError::Lost`]
//!   from `release` as "my critical section may have overlapped another's".
//!
//! Nodes that restart without persistence forget their locks, and another
//! client may then win a quorum while the first still holds the lock. Run
//! the nodes with `appendonly yes` and `appendfsync always`, or keep a
//! restarted node out of service for longer than your longest TTL:
//! [`RedlockBuilder::restart_grace`] does that from the client side.
//! Timing uses [`std::time::Instant`] only; clock drift between processes is
//! assumed small next to the TTL, which is what the drift term pays for.
//! [The contract](contract) says, fault by fault, when a lock is exclusive
//! and when its holder is told it may not have been.
//!
//! # Known limits
//!
//! - One connection per node is shared by all threads of a client: a
//!   thread whose deadline passes while it reads drops the connection for
//!   all of them, and a node slow for one thread is slow for all. Over TLS
//!   the connection cannot be split into reading and writing halves: a
//!   command that finds another thread reading goes out when that read
//!   returns (up to two round trips), so keep `io_timeout` above twice the
//!   slowest TLS node's round trip, or give such threads a client each.
//! - Some waits have no time bound of this crate's: over TLS, host names
//!   are resolved by the `redis` crate on each connect (list nodes by IP
//!   address where DNS may be slow; plain `redis://` names are resolved
//!   within the connect timeout) and a reply trickled out byte by byte can
//!   hold a round past `io_timeout` (the timeout applies per read there); a
//!   Unix-socket connect cannot be bounded while the server's listen queue
//!   is full.
//! - A node whose connect timed out, or was cut short by the round's
//!   deadline, is skipped for ten `io_timeout`s (within 100 ms and 2 s),
//!   even if it answers again at once; a `connect_timeout` far above
//!   `io_timeout` does not help.
//! - After `SCRIPT FLUSH` on a node, a release or extension whose reply was
//!   not awaited did not happen there (the key keeps its TTL), for at most
//!   32 rounds (the slowest node is awaited at least that often).
//! - Waiters are woken by hints, with no fairness (see [`Patience`]).
//!
//! # Features
//!
//! - `tls`: `rediss://` (and `valkeys://`) node URLs, through the `redis`
//!   crate's rustls support. The application selects rustls' crypto
//!   provider (for instance
//!   `rustls = { version = "0.23", features = ["ring"] }` among its
//!   dependencies); without one, `rediss://` nodes fail with a
//!   [`NodeError::Connect`] that says so. Certificates are checked against
//!   the system's roots, or those in the PEM file that `SSL_CERT_FILE`
//!   names.
//!
//! # Testing
//!
//! The companion crate
//! [`redlock-sync-testing`](https://docs.rs/redlock-sync-testing) starts
//! throwaway real `redis-server` nodes and a fault-injecting proxy, for
//! your own tests (it is what this crate's tests use).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod error;
mod event;
mod kind;
mod lock;
mod node;
mod request;
mod retry;
mod round;
mod script;
mod setters;
mod time;
mod token;
mod wait;

#[doc = include_str!("../docs/contract.md")]
pub mod contract {}

pub use client::config::{RedlockBuilder, MAX_TIMEOUT, MAX_TTL};
pub use client::guard::LockGuard;
pub use client::inspect::{Holding, Inspection, NodeView, Verdict};
pub use client::Redlock;
pub use error::{
    ArgumentError, ConfigError, LockError, Loss, NodeError, NodeOutcome, NodeReport,
    ParseTokenError, Report,
};
pub use event::{Event, What};
pub use kind::{Kind, FENCE_KEY_PREFIX};
pub use lock::{IntoResources, Lock};
pub use request::{Cancel, LockOptions, Patience};
pub use retry::RetryPolicy;
pub use token::Token;

/// The crate's socket `write` and `read` calls so far, for its benchmark
/// (`benches/redlock.rs`): a count, not part of the API.
#[doc(hidden)]
pub use node::{io_counts, IoCounts};

/// The crate's release script, for its benchmark's floor: not part of the
/// API.
#[doc(hidden)]
pub const RELEASE_SCRIPT: &str = script::RELEASE.body;

/// The README's code blocks, compiled (and, where they need no servers, run)
/// as doctests, so that `cargo test` fails when the README and the API part
/// ways.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
