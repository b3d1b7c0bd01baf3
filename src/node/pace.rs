//! Batching, as an event loop does it. When queued commands are written,
//! and how long a thread yields before it parks.
//!
//! A round queues its command on every node. The last of the client's
//! threads to fall asleep writes every node's queue, one write per node.
//! Falling asleep is blocking on a read, sleeping for a reply, or leaving
//! the round. A thread alone writes its own command at once. The exception:
//! enough replies are on the wire that the threads they wake will carry it
//! ([`BATCH_FROM`]). A thread blocked on a read never counts, so no command
//! waits behind a read. Its own thread writes a command whose writer is
//! overdue ([`RECHECK`]).
//!
//! Correctness never depends on this: every command gets written, by the
//! last thread awake or by its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The longest a thread sleeps before it checks for a free reader role, or
/// writes its still-queued command itself. A reader lets go without waking
/// anyone while a thread is awake, and that thread owes the queued write.
/// This bounds what either costs, should that thread go elsewhere.
pub(crate) const RECHECK: Duration = Duration::from_millis(2);

/// How many rounds must await replies on the wire for a lone round to
/// queue its command for their batch. Below this, the wait costs more than
/// the write it saves.
pub(crate) const BATCH_FROM: u64 = 6;

/// The pace of one client's threads: how many run round code that will
/// queue commands soon. A round holds the pace while it queues on every node. A thread woken
/// with its reply holds it from then on, on the waker's account. So the
/// threads one read wakes queue their next commands together.
#[derive(Default)]
pub(crate) struct Pace {
    awake: AtomicUsize,
}

impl Pace {
    /// One more thread will queue commands soon. Returns true if no other thread was awake.
    pub(crate) fn hold(&self) -> bool {
        self.awake.fetch_add(1, Ordering::AcqRel) == 0
    }

    /// A thread that held the pace falls asleep or leaves. Returns true if
    /// it was the last awake, and must write every node's queue.
    pub(crate) fn release(&self) -> bool {
        self.awake.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Whether a thread awake will write what is queued now.
    pub(crate) fn others_awake(&self) -> bool {
        self.awake.load(Ordering::Acquire) > 0
    }
}

/// Before a thread parks for its replies, it yields the CPU this many
/// times. The threads that run meanwhile often read those replies. A reply
/// stored while its thread yields costs no futex call and no sleep.
pub(crate) const YIELDS: u32 = 4;
