//! Clean-ups a node is owed: releases after a failed attempt that could not
//! be sent. They are kept while their key could be alive, and sent first on
//! the node's next connection.
//!
//! Without them, a late `SET` where the clean-up missed would hold the
//! resource for its whole TTL. The token guards a release, so
//! sending it twice, or after the key expired, is harmless.

use std::sync::Mutex;
use std::time::Instant;

use crate::sync::lock;

/// At most this many clean-ups are kept per node. Past it the oldest is
/// dropped, and its key expires on its own.
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
    /// The packed command, as `EVAL`: a new connection may lack the script.
    bytes: Vec<u8>,
}

impl Owed {
    /// Owes the node `bytes`, until `until`.
    pub(super) fn add(&self, bytes: Vec<u8>, until: Instant) {
        let mut entries = lock(&self.entries);
        let now = Instant::now();
        entries.list.retain(|e| e.until > now);
        if entries.list.len() >= MAX_OWED {
            entries.list.remove(0);
        }
        let id = entries.next_id;
        entries.next_id += 1;
        entries.list.push(Debt { id, until, bytes });
    }

    /// The clean-ups still worth sending: their packed commands, and which
    /// entries they are. They stay owed until [`settle`](Self::settle) says
    /// a connection delivered them.
    pub(super) fn due(&self) -> (Vec<u8>, Vec<u64>) {
        let mut entries = lock(&self.entries);
        let now = Instant::now();
        entries.list.retain(|e| e.until > now);
        let list = &entries.list;
        let bytes = list.iter().flat_map(|d| &d.bytes).copied().collect();
        (bytes, list.iter().map(|d| d.id).collect())
    }

    /// The server answered the clean-ups `ids`: they are no longer owed.
    pub(super) fn settle(&self, ids: &[u64]) {
        lock(&self.entries).list.retain(|e| !ids.contains(&e.id));
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
        let (bytes, ids) = owed.due();
        assert_eq!(bytes, b"ac");
        owed.settle(&ids[..1]);
        assert_eq!(owed.due().0, b"c");
        owed.settle(&ids);
        assert!(owed.due().1.is_empty());
    }

    #[test]
    fn at_most_max_owed_are_kept_and_the_oldest_goes_first() {
        let owed = Owed::default();
        let later = Instant::now() + Duration::from_secs(60);
        for i in 0..=MAX_OWED {
            owed.add(i.to_string().into_bytes(), later);
        }
        let (bytes, ids) = owed.due();
        assert_eq!(ids.len(), MAX_OWED);
        assert!(bytes.starts_with(b"12"));
    }
}
