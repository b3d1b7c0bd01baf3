//! Clean-ups a node is owed: releases that could not be sent after a failed
//! attempt (the node was unreachable, or backing off reconnecting), kept
//! while the key they release could still be alive, and sent first on the
//! node's next connection, before any other command.
//!
//! Without them, a `SET` that landed late on a node the clean-up could not
//! reach would hold the resource for the rest of its TTL, for every client.
//! A release is guarded by the attempt's token, so sending one twice, or
//! after the key expired, is harmless.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// At most this many clean-ups are kept per node; past it the oldest is
/// dropped (its key then expires on its own, as it would have before).
const MAX_OWED: usize = 1024;

/// The clean-ups one node is owed.
#[derive(Default)]
pub(super) struct Owed {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    next_id: u64,
    list: Vec<Debt>,
}

struct Debt {
    id: u64,
    /// Past this, the key the release is for has expired.
    until: Instant,
    /// The packed command (`EVAL`: a new connection may not know the
    /// script yet).
    bytes: Vec<u8>,
}

/// What a new connection sends for the clean-ups due: their packed
/// commands, one after the other, and which entries they are.
#[derive(Default)]
pub(super) struct Due {
    pub(super) bytes: Vec<u8>,
    pub(super) ids: Vec<u64>,
}

impl Owed {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Owes the node `bytes`, until `until`.
    pub(super) fn add(&self, bytes: Vec<u8>, until: Instant) {
        let mut entries = self.lock();
        let now = Instant::now();
        entries.list.retain(|e| e.until > now);
        if entries.list.len() >= MAX_OWED {
            entries.list.remove(0);
        }
        let id = entries.next_id;
        entries.next_id += 1;
        entries.list.push(Debt { id, until, bytes });
    }

    /// The clean-ups still worth sending. They stay owed until
    /// [`settle`](Self::settle) says a connection delivered them.
    pub(super) fn due(&self) -> Due {
        let mut entries = self.lock();
        let now = Instant::now();
        entries.list.retain(|e| e.until > now);
        let mut due = Due::default();
        for entry in &entries.list {
            due.bytes.extend_from_slice(&entry.bytes);
            due.ids.push(entry.id);
        }
        due
    }

    /// The server answered the clean-ups `ids`: they are no longer owed.
    pub(super) fn settle(&self, ids: &[u64]) {
        self.lock().list.retain(|e| !ids.contains(&e.id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn owed_clean_ups_are_due_until_settled_or_expired() {
        let owed = Owed::default();
        let later = Instant::now() + Duration::from_secs(60);
        owed.add(b"a".to_vec(), later);
        owed.add(b"b".to_vec(), Instant::now());
        owed.add(b"c".to_vec(), later);
        let due = owed.due();
        assert_eq!(due.bytes, b"ac");
        owed.settle(&due.ids[..1]);
        assert_eq!(owed.due().bytes, b"c");
        owed.settle(&due.ids);
        assert!(owed.due().ids.is_empty());
    }

    #[test]
    fn at_most_max_owed_are_kept_and_the_oldest_goes_first() {
        let owed = Owed::default();
        let later = Instant::now() + Duration::from_secs(60);
        for i in 0..=MAX_OWED {
            owed.add(i.to_string().into_bytes(), later);
        }
        let due = owed.due();
        assert_eq!(due.ids.len(), MAX_OWED);
        assert!(due.bytes.starts_with(b"12"));
    }
}
