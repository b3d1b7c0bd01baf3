//! What a node holds for a resource: its keys, their values, and the
//! scripts that read and write them ([`script`]). Nothing else forms a key
//! or a channel, and no script forms one: each comes in `KEYS`.
//!
//! For a resource `R`, each node may hold:
//!
//! | key | type | value | written by | deleted by |
//! |---|---|---|---|---|
//! | `R`, a writer's | string | `TOKEN[~MARK][ OWNER]`, with a TTL | `SET NX`, the acquire and extend scripts | the release script; expiry |
//! | `R`, holders' | sorted set | each holder's token, scored by its expiry (node ms); one marker `redlock-sync:2:kind=K` (the layout's version, 2, and the kind), scored `-inf` | the shared script | the shared script, with its last holder; expiry, with its last holder |
//! | [owners](owners_key) | hash | each holder's token, to its owner label | the shared script, at admission | the shared script, with its holder; expiry, with the set |
//! | [`fence_key`] | string | the fencing counter, an integer below 2^53, no TTL | the fenced scripts, the extend script's re-take | never (see [`Kind::Fenced`](crate::Kind::Fenced)) |
//! | intents | sorted set | each waiting writer's acquisition id, scored by its expiry (node ms) | a writer's acquire scripts | its own acquisition (the winning script, [`script::WITHDRAW`]); expiry, with its last intent |
//! | an older client's intent, `redlock-sync:intent:R` | string | `1`, with a TTL | older clients only | older clients; expiry |
//!
//! A holder's release publishes its token on the release channel. The
//! `~MARK` is an extension's unconfirmed re-take ([`script::EXTEND`],
//! [`script::CONFIRM`]). Each script's replies are told on its constant.
//!
//! A client that meets a holders' set of another layout of this crate (a
//! marker of another version, or an older client's set: token-shaped
//! members and no marker) refuses it with
//! [`NodeError::OtherVersion`](crate::NodeError::OtherVersion), and never
//! writes it.
//!
//! Every key and the channel of a resource lie in `R`'s own hash slot, for
//! a node that is a Redis Cluster: the lock key is `R` itself, byte for
//! byte, and every side key carries a hash tag `{TAG}` whose slot is
//! `R`'s ([`slot`]). Names under the prefix `redlock-sync:` are refused as
//! resources, so no resource is ever one of these keys.

pub(crate) mod reply;
pub(crate) mod script;

use std::sync::OnceLock;

/// The prefix of every key and channel this crate keeps beside a lock's own.
pub(crate) const PREFIX: &str = "redlock-sync:";

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// The key of `resource`'s fencing counter on every node, in the
/// resource's own hash slot.
///
/// A counter never expires: it must outlive every lock to keep tokens
/// rising. It costs one small key per resource ever locked with
/// [`Kind::Fenced`](crate::Kind::Fenced). The crate reserves
/// `redlock-sync:` for its keys: locking a name under it fails with
/// [`ArgumentError::ReservedResource`](crate::ArgumentError::ReservedResource).
/// Deleting a counter is safe, given the clock caveats in
/// [`Kind`](crate::Kind).
///
/// ```
/// use redlock_sync::fence_key;
///
/// let key = fence_key("invoice:42");
/// assert!(key.starts_with("redlock-sync:{") && key.ends_with("}:fence:invoice:42"));
/// ```
pub fn fence_key(resource: &str) -> String {
    side("fence", resource)
}

/// The key of `resource`'s waiting writers' intents.
pub fn intents_key(resource: &str) -> String {
    side("intents", resource)
}

/// The key of the owner labels of `resource`'s shared or counted holders.
pub(crate) fn owners_key(resource: &str) -> String {
    side("owners", resource)
}

/// The key of an older client's intent on `resource`: read, never written.
pub(crate) fn older_intent_key(resource: &str) -> String {
    format!("{PREFIX}intent:{resource}")
}

/// The channel on which a release of `resource` is announced.
pub fn released_channel(resource: &str) -> String {
    side("released", resource)
}

/// The resource whose releases `channel` announces, if it is one of ours.
pub(crate) fn resource_of_channel(channel: &str) -> Option<&str> {
    let tagged = channel.strip_prefix(PREFIX)?.strip_prefix('{')?;
    let (_, rest) = tagged.split_once('}')?;
    rest.strip_prefix(":released:")
}

/// `redlock-sync:{TAG}:WHAT:RESOURCE`, where `{TAG}` gives `resource`'s slot.
fn side(what: &str, resource: &str) -> String {
    let tag = tag(slot(resource.as_bytes()));
    format!("{PREFIX}{{{tag}}}:{what}:{resource}")
}

/// The hash slot of a key, by Redis Cluster's rule: the part between the
/// first `{` and the first `}` after it, if that is not empty, else the
/// whole key; its CRC16 modulo 16,384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(0) | None => key,
            Some(len) => &key[open + 1..open + 1 + len],
        },
        None => key,
    };
    crc16(hashed) % SLOTS as u16
}

/// CRC16-CCITT (XModem), as Redis Cluster hashes keys.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The shortest tag (1 to 3 letters and digits, the first found) whose
/// slot is `slot`. The table is built once, on first use.
fn tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut tags = vec![String::new(); SLOTS];
        let mut left = SLOTS;
        let mut candidate = Vec::with_capacity(3);
        'search: for len in 1..=3 {
            for n in 0..ALPHABET.len().pow(len) {
                candidate.clear();
                let mut rest = n;
                for _ in 0..len {
                    candidate.push(ALPHABET[rest % ALPHABET.len()]);
                    rest /= ALPHABET.len();
                }
                let found = &mut tags[usize::from(crc16(&candidate)) % SLOTS];
                if found.is_empty() {
                    *found = String::from_utf8_lossy(&candidate).into_owned();
                    left -= 1;
                    if left == 0 {
                        break 'search;
                    }
                }
            }
        }
        tags
    });
    &tags[usize::from(slot)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_of_at_most_three_letters_that_hashes_to_it() {
        for slot_wanted in 0..SLOTS as u16 {
            let tag = tag(slot_wanted);
            assert!((1..=3).contains(&tag.len()), "slot {slot_wanted}: {tag:?}");
            assert_eq!(slot(tag.as_bytes()), slot_wanted, "{tag}");
        }
    }

    #[test]
    fn slots_follow_the_cluster_specs_examples_and_its_hash_tag_rule() {
        // The Cluster spec's test vector: CRC16 of "123456789" is 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }

    #[test]
    fn side_keys_and_the_channel_read_back_to_their_resource() {
        for resource in ["r", "a{x}b", "a{}b", "}{", "{{x}}", "}", "ключ", "a:b:c"] {
            let channel = released_channel(resource);
            assert_eq!(resource_of_channel(&channel), Some(resource));
            for key in [fence_key(resource), intents_key(resource), channel] {
                assert_eq!(slot(key.as_bytes()), slot(resource.as_bytes()), "{key}");
            }
        }
        assert_eq!(resource_of_channel("redlock-sync:released:r"), None);
        assert_eq!(resource_of_channel("other"), None);
    }
}
