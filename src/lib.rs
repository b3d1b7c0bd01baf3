//! Distributed locks over N independent Redis or Valkey masters, after the
//! Redlock algorithm. Every call is synchronous: there is no async runtime. A
//! round costs one network round trip, however many nodes there are.
//!
//! # The doors
//!
//! One client, [`Redlock`], serves every thread of a process. Six of its
//! methods acquire a lock:
//!
//! | method | waits, by default | returns |
//! |---|---|---|
//! | [`acquire`](Redlock::acquire) | the retry policy: 3 retries, about 1 s | a [`Lock`], yours until its validity runs out |
//! | [`try_acquire`](Redlock::try_acquire) | one attempt | a [`Lock`] |
//! | [`lock`](Redlock::lock) | while another client holds it | a [`LockGuard`], extended by a watchdog |
//! | [`try_lock`](Redlock::try_lock) | one attempt | a [`LockGuard`] |
//! | [`with_lock`](Redlock::with_lock) | while another client holds it | what your closure returns, run under a guard |
//! | [`try_with_lock`](Redlock::try_with_lock) | one attempt | what your closure returns |
//!
//! A wait while another client holds the lock ([`Patience::WhileHeld`]) has
//! no bound of its own: a holder that keeps extending keeps it waiting. Set
//! the builder's [`max_wait`](RedlockBuilder::max_wait), or a [`Patience`],
//! to bound it.
//!
//! Three more act on a lock or a resource:
//!
//! | method | what it does |
//! |---|---|
//! | [`extend`](Redlock::extend) | gives a [`Lock`] a new TTL |
//! | [`release`](Redlock::release) | deletes a [`Lock`]'s keys, and returns a [`Report`] |
//! | [`inspect`](Redlock::inspect) | reads who holds a resource (owners, time left, each kind on its own quorum), without writing |
//!
//! Each acquiring method takes what to lock and how. What: a resource name, or
//! several as one lock ([`IntoResources`]). How: a [`LockOptions`], or a bare
//! `Duration` for the TTL alone. The options carry:
//!
//! - the [`Kind`]: plain, fenced with a fencing token, shared (readers beside
//!   one another, never beside a writer), or a semaphore of `K` permits;
//! - an owner label, shown by [`inspect`](Redlock::inspect);
//! - the [`Patience`] of the waiting methods;
//! - a guard's hold cap and the point at which it is extended;
//! - a [`Cancel`] handle that ends a wait from another thread.
//!
//! What the options leave unset comes from the client, set up with
//! [`Redlock::builder`]. The builder's [`observer`](RedlockBuilder::observer)
//! hands every change to your logs as an [`Event`]. Every failure is a
//! [`LockError`], whose documentation says what to do about each variant.
//! Every operation says what each node answered ([`Lock::report`],
//! [`LockError::report`]). No message and no `Debug` output shows a password.
//!
//! # The simple path
//!
//! A batch job needs four names: [`Redlock`], [`with_lock`](Redlock::with_lock),
//! [`LockError`] and a [`Duration`](std::time::Duration).
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_sync::{LockError, Redlock};
//!
//! let locks = Redlock::new([
//!     "redis://10.0.0.1:6379",
//!     "redis://10.0.0.2:6379",
//!     "redis://10.0.0.3:6379",
//! ])?;
//! let rows = locks.with_lock("nightly-report", Duration::from_secs(10), |guard| {
//!     let mut rows = 0;
//!     for _batch in 0..1_000 {
//!         guard.check()?; // stop at once if the lock was lost
//!         rows += 1; // ... one batch of work, however long it all takes ...
//!     }
//!     Ok::<_, LockError>(rows)
//! })?;
//! println!("{rows} rows");
//! # Ok::<(), LockError>(())
//! ```
//!
//! `with_lock` waits while another client holds the lock, however long that
//! takes (too few nodes answering ends it after the retry policy's 3
//! retries). Then it runs the
//! closure, and releases the lock when the closure ends, panics included. A
//! watchdog thread extends the lock meanwhile, so the closure may outlast the
//! TTL. [`check`](LockGuard::check) fails once the lock is lost. If the lock
//! was lost at any moment, `with_lock` returns [`LockError::Lost`], even when
//! the closure returned `Ok`. Record "job done" inside the closure, after a
//! last `check`. After the release, another worker may already hold the lock.
//!
//! # Rounds
//!
//! Every operation is a *round*. The same command goes to every node. All the
//! writes go out before any reply is read. The replies are read against one
//! deadline, `io_timeout` after the round began. So a dead or hung node costs
//! at most `io_timeout`. Reading stops once the outcome is decided, and the
//! other replies are discarded later ([`NodeOutcome::NotAwaited`]).
//!
//! - An acquisition sets the key with `SET NX PX` on every node. It wins when
//!   a quorum (`N / 2 + 1`) set it with validity left.
//! - The validity is `ttl - elapsed - (ttl * drift_factor + 2 ms)`. It counts
//!   from just before the first write, on the monotonic clock.
//! - An attempt that lost is undone on every node that did not refuse it. The
//!   [`RetryPolicy`] then plans a random pause.
//! - An error or a timeout closes that node's connection for all threads. So
//!   a late reply never answers a later command.
//!
//! # Guards and locks
//!
//! [`lock`](Redlock::lock) returns the guard that `with_lock` uses, for code
//! that does not fit in a closure. Dropping the guard releases the lock, also
//! on `?` or while a panic unwinds.
//! [`unlock`](LockGuard::unlock) releases it too, and says whether it was
//! held throughout. One watchdog thread per client extends all its guards.
//!
//! ```no_run
//! # use std::time::Duration;
//! use redlock_sync::{LockError, Redlock, What};
//!
//! let locks = Redlock::builder(["redis://127.0.0.1:7001"])
//!     // Hand events to `log` or `tracing` here; the crate logs nothing itself.
//!     .observer(|event| {
//!         if matches!(event.what, What::NodeFailed | What::ExtendFailed | What::Lost) {
//!             eprintln!("redlock: {event:?}");
//!         }
//!     })
//!     .build()?;
//! let guard = locks.lock("search-index", Duration::from_secs(10))?;
//! guard.on_lost(|e| eprintln!("lost the index lock: {e}"));
//! for _shard in 0..64 {
//!     guard.check()?; // lost: return, and the drop releases
//! }
//! guard.unlock()?; // Err(Lost) if the lock was lost at any moment
//! println!("{:?}", locks.inspect("search-index")?.verdict());
//! # Ok::<(), LockError>(())
//! ```
//!
//! [`wait_lost`](LockGuard::wait_lost) blocks until the lock is lost.
//! [`on_lost`](LockGuard::on_lost) runs a callback then, on the client's
//! notifier thread. That makes two threads per client, however many guards.
//!
//! A [`Lock`] from `acquire` has no watchdog. Work only while its
//! [`validity`](Lock::validity) is well above zero. Call `extend` before it
//! runs out, and `release` at the end. A lock taken in one process can be
//! extended or released in another. That one needs only the resource and the
//! [`Token`] ([`Lock::from_token`]).
//!
//! # Options
//!
//! ```no_run
//! # use std::time::Duration;
//! use redlock_sync::{Cancel, Kind, LockError, LockOptions, Patience, Redlock, RetryPolicy};
//!
//! let locks = Redlock::builder(["redis://127.0.0.1:7001"])
//!     .retry_policy(RetryPolicy::default().retries(10))
//!     .build()?;
//! let ttl = Duration::from_secs(10);
//! // Two resources as one lock: both or neither, on every node.
//! let pair = locks.try_acquire(["account:alice", "account:bob"], ttl)?;
//! locks.release(pair)?;
//! // A fencing token for the protected resource to check.
//! let fenced = locks.acquire("ledger", LockOptions::new(ttl).kind(Kind::Fenced))?;
//! assert!(fenced.fencing_token().is_some());
//! locks.release(fenced)?;
//! // Wait until won, or until another thread calls shutdown.cancel().
//! let shutdown = Cancel::new();
//! let leader = LockOptions::new(ttl).patience(Patience::Forever).cancel(&shutdown);
//! match locks.lock("leader", leader) {
//!     Ok(guard) => drop(guard), // lead while guard.check() is Ok
//!     Err(LockError::Cancelled { .. }) => {} // shutting down
//!     Err(e) => return Err(e),
//! }
//! # Ok::<(), LockError>(())
//! ```
//!
//! # Node URLs
//!
//! A node is `redis://[user:password@]host:port[/db]`, or
//! `redis+unix:///path?db=N&pass=P`. With the `tls` feature, `rediss://` works
//! too. The `valkey://`, `valkey+unix://` and `valkeys://` schemes are the
//! same. A URL that does not parse gives [`ConfigError::NodeUrl`], which names
//! the wrong part.
//!
//! # What a lease can promise
//!
//! A Redlock lock is a *lease*: it is yours until its validity runs out. A
//! holder may pause past that point (a long GC, swapping, `SIGSTOP`). Another
//! client may then take the lock, and both write. No client library can
//! prevent that.
//!
//! - For **efficiency**, such as not doing the same work twice, Redlock fits.
//!   A rare overlap costs some duplicate work.
//! - For **correctness**, the protected resource must reject stale holders
//!   itself. Take a [`Kind::Fenced`] lock, and have the resource refuse tokens
//!   lower than the highest it has seen. Or use a consensus system (etcd,
//!   ZooKeeper).
//!
//! A node that restarts without persistence forgets its locks. Run the nodes
//! with `appendonly yes` and `appendfsync always`. Or keep a restarted node
//! out for longer than the longest TTL, with
//! [`RedlockBuilder::restart_grace`]. Run them with `maxmemory-policy
//! noeviction`, too. Timing uses [`Instant`](std::time::Instant) only. Clock
//! drift between processes is assumed small next to the TTL. [The
//! contract](contract) says, fault by fault, when a lock stays exclusive. It
//! also says when its holder is told that it may not have.
//!
//! # Which nodes
//!
//! Use 3 or 5 independent masters, in separate failure domains. Each can be
//! small: a lock is one short key.
//!
//! - Not a primary with replicas: replication is asynchronous. A failover can
//!   lose a lock's key, and then two clients hold the lock.
//! - Such a primary can still serve as one node (N = 1). That suits locks that
//!   save duplicate work, with no fault tolerance.
//! - Not a Redis Cluster: this crate talks to each node as one server. It does
//!   not follow `MOVED` redirects. List standalone masters instead.
//!
//! # From async code
//!
//! Every call blocks its thread, and so does a guard's drop. On an async
//! runtime, run the whole locked section in `tokio::task::spawn_blocking` or
//! its like. Let the guard live and die on that thread. A [`Cancel`] handle
//! ends a wait from the async side.
//!
//! # Known limits
//!
//! - All threads of a client share one connection per node. A node slow for
//!   one thread is slow for all.
//! - Over TLS, a command may wait one more round trip: the connection cannot
//!   be split into halves. Keep `io_timeout` above two such round trips.
//! - Over TLS, host name lookups and replies trickled byte by byte are not
//!   bounded by `io_timeout`. Nor is a Unix-socket connect to a full backlog.
//! - A node whose connect timed out is skipped for ten `io_timeout`s (within
//!   100 ms and 2 s).
//! - After `SCRIPT FLUSH` on a node, a release or extension left unread may
//!   fail there. That lasts at most 32 rounds.
//!
//! # Features
//!
//! - `tls`: `rediss://` and `valkeys://` nodes, through the `redis` crate's
//!   rustls support. The application picks rustls' crypto provider, for
//!   instance with `rustls = { version = "0.23", features = ["ring"] }`.
//!   Without one, such a node fails with a [`NodeError::Connect`] that says
//!   so. Certificates are checked against the system's roots, or the PEM file
//!   that `SSL_CERT_FILE` names.
//!
//! # Testing
//!
//! The companion crate
//! [`redlock-sync-testing`](https://docs.rs/redlock-sync-testing) starts
//! throwaway `redis-server` nodes and a fault-injecting proxy.

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
mod setters;
mod store;
mod sync;
mod time;
mod token;
mod wait;

#[doc = include_str!("../docs/contract.md")]
pub mod contract {}

pub use client::config::{RedlockBuilder, MAX_TIMEOUT, MAX_TTL};
pub use client::guard::LockGuard;
pub use client::inspect::{Holder, Holding, Inspection, NodeView, Verdict};
pub use client::Redlock;
pub use error::{
    ArgumentError, ConfigError, LockError, Loss, NodeError, NodeOutcome, NodeReport,
    ParseTokenError, Report,
};
pub use event::{Event, What};
pub use kind::Kind;
pub use lock::{IntoResources, Lock};
pub use request::{Cancel, LockOptions, Patience};
pub use retry::RetryPolicy;
pub use store::fence_key;
pub use token::Token;

/// The crate's socket `write` and `read` calls so far, for its benchmark
/// (`benches/redlock.rs`): a count, not part of the API.
#[doc(hidden)]
pub use node::{io_counts, IoCounts};

/// The keys and channel of a resource, for the tests that read them from
/// the nodes: not part of the API.
#[doc(hidden)]
pub use store::{intents_key, released_channel};

/// The crate's release script, for its benchmark's floor: not part of the
/// API.
#[doc(hidden)]
pub const RELEASE_SCRIPT: &str = store::script::RELEASE.body;

/// The README's code blocks, compiled (and, where they need no servers, run)
/// as doctests, so that `cargo test` fails when the README and the API part
/// ways.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
