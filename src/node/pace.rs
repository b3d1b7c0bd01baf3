//! Batching, as an event loop does it: when the commands that the client's
//! threads queue on a node's shared connection are written, and how long a
//! thread gives up the CPU before it parks.
//!
//! A round queues its command on every node, and the last of the client's
//! threads to fall asleep (to block on a read, to sleep until a reply
//! comes, or to leave its round) writes every node's queue in one write per
//! node. A thread alone writes its own command at once, unless enough other
//! rounds await replies on the wire that the threads those replies wake
//! will carry it ([`BATCH_FROM`]). A thread blocked on a read never counts,
//! so no command waits behind a read; a queued command whose writer is
//! overdue ([`RECHECK`]) is written by its own thread.
//!
//! Correctness never depends on any of this: every command gets written,
//! by the last thread awake, or by its own thread once that is overdue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How long a thread sleeps at most before it looks again whether a
/// reading role it waits on is free, or writes its command itself if it is
/// still queued: a reader lets go without waking anyone while a thread is
/// awake, and a thread awake owes the write of what is queued; this bounds
/// what either may cost, should that thread go elsewhere.
pub(crate) const RECHECK: Duration = Duration::from_millis(2);

/// From how many rounds awaiting replies on the wire a round that starts
/// alone (no other thread awake) leaves its command queued for the batch
/// that those replies will set off, rather than write it alone: below
/// this, the wait for the batch costs more than the write it saves.
pub(crate) const BATCH_FROM: u64 = 6;

/// The pace of one client's threads: how many are running round code that
/// will queue commands soon. Commands queued meanwhile wait, and the last
/// of these threads to fall asleep writes every node's queue.
///
/// A round holds the pace while it queues its command on every node, and
/// a thread woken with its reply holds it from then on, on the waker's
/// account: the threads one read wakes queue their next commands together.
#[derive(Default)]
pub(crate) struct Pace {
    awake: AtomicUsize,
}

impl Pace {
    /// One more thread will queue commands soon. Returns true if no other
    /// thread was awake.
    pub(crate) fn hold(&self) -> bool {
        self.awake.fetch_add(1, Ordering::AcqRel) == 0
    }

    /// A thread that held the pace falls asleep or leaves. Returns true if
    /// it was the last awake: it must write every node's queue.
    pub(crate) fn release(&self) -> bool {
        self.awake.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Whether a thread awake will write what is queued now.
    pub(crate) fn others_awake(&self) -> bool {
        self.awake.load(Ordering::Acquire) > 0
    }
}

/// Before a thread parks to wait for its replies, it gives up the CPU a few
/// times: the threads that run meanwhile are often the ones reading those
/// replies, and a reply stored while its thread still yields costs no
/// futex call and no sleep. (parking_lot's `SpinWait`, without the spin.)
#[derive(Default)]
pub(crate) struct SpinWait {
    yields: u32,
}

impl SpinWait {
    /// How many times a thread yields before it parks.
    const YIELDS: u32 = 4;

    /// Yields the CPU, unless it did so enough already: then returns false,
    /// and the thread should park.
    pub(crate) fn spin(&mut self) -> bool {
        if self.yields >= Self::YIELDS {
            return false;
        }
        self.yields += 1;
        std::thread::yield_now();
        true
    }
}
