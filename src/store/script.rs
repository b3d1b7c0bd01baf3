//! The Lua scripts, and the commands that run them.
//!
//! A script goes as `EVALSHA` where the server is known to have it, else as
//! `EVAL`, which caches it. A `NOSCRIPT` reply (after `SCRIPT FLUSH`, say)
//! is retried as `EVAL` in the same round. The common path is one round
//! trip.

use std::io::Write;
use std::sync::OnceLock;

use redis::Value;

/// One Lua script, its SHA1 (hex), and its bit in a connection's set of
/// scripts the server has cached.
pub(crate) struct Script {
    pub(crate) bit: u8,
    pub(crate) body: &'static str,
    pub(crate) sha: &'static str,
}

/// A clean-up's second argument to the release script: publish nothing.
pub(crate) const QUIET: &[u8] = b"quiet";

/// Deletes each key whose value is our token. Returns how many of those
/// were unmarked. The node held the lock if that equals the key count. For
/// one key this is the classic `if get == token then del` script.
///
/// Each deleted key is announced in the same call: a `PUBLISH` of the token
/// on its channel ([`released_channel`](super::released_channel), given
/// after the locks in `KEYS`). An unheard `PUBLISH` costs
/// a hash lookup. A key held by another publishes nothing.
///
/// A holder's release (no second argument) also publishes where the key is
/// absent. The holder may never have reached that node, and a waiter may
/// listen there. A clean-up ([`QUIET`]) publishes nothing: its key was
/// never the lock. Two clients' clean-ups would otherwise wake each other's
/// waiters again and again.
///
/// `PUBLISH` goes by `pcall`. A user without channel permissions (the ACL
/// default since Redis 7) still releases; waiters sleep out their pause.
///
/// A key of another type is held by another, unless our token is among its
/// members: then it is the wrong kind's release (`WRONGKIND`, an error).
pub(crate) const RELEASE: Script = Script {
    bit: 1,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/release.lua")
    ),
    sha: "2d169cf7d9439e98c453053fd8a3d3047544f477",
};

/// Extends many locks in one call. `ARGV[1]` is the round's re-take mark.
/// Each lock then has four arguments, and its keys in the same order. The
/// arguments: its key count, its stored value, its new TTL in ms, and its
/// re-take (empty for none). It returns one reply per lock, in order. Each
/// lock is all or nothing over its keys:
///
/// - 1, *renewed*: every key holds the stored value, so it was there all
///   along. Each gets the new TTL, its value kept.
/// - 2, *re-taken*: no key holds another token, and some are absent or
///   marked. Every key gets the token, marked with this round's mark (see
///   [`CONFIRM`]), and the new TTL.
/// - 0: a key holds another token; nothing is written.
/// - 3: as 2, but the lock may not re-take; nothing is written.
///
/// A re-take above zero is a fenced lock's token. Its last key is then its
/// fencing counter, raised to at least that token. The counter is read
/// before any write: one that is not a number makes the reply an error.
pub(crate) const EXTEND: Script = Script {
    bit: 2,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/extend.lua")
    ),
    sha: "f7149dbe5ca3fabecbcaabf6b2eadf0f1bba0e59",
};

/// Confirms one round's re-takes: a key marked with `ARGV[1]` (see
/// [`EXTEND`]) loses the mark, its TTL kept. It goes only where a round
/// that held read the re-take's reply. A re-take elsewhere keeps its mark,
/// and never counts as renewed.
pub(crate) const CONFIRM: Script = Script {
    bit: 8,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/confirm.lua")
    ),
    sha: "0c199d70af2f27907cfb57abb2a917b455305f9d",
};

/// A writer's acquisition: `KEYS` are the locks, then their writers'
/// intents. `ARGV`: our value, the TTL in ms, and for a writer that waited,
/// the acquisition's id. Sets every lock to our value with the TTL, if none
/// of them exists, and withdraws our intents: returns 1. Else returns 0,
/// and a writer that waited marks its intent on each lock that shared or
/// counted holders hold ([`WITHDRAW`] says how intents live).
pub(crate) const ACQUIRE_MANY: Script = Script {
    bit: 4,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/acquire_many.lua")
    ),
    sha: "8d0cb44f73f410265967e2e5bd2d9623b15439c2",
};

/// Withdraws one acquisition's intents (`ARGV[1]`, its id) from each of
/// `KEYS`, the writers' intents of its resources.
///
/// A writer refused where shared or counted holders hold marks its intent
/// ([`ACQUIRE_MANY`], [`FENCE_ACQUIRE`]): a member named by its
/// acquisition's id, scored by its expiry on the node's clock. New readers
/// and permit holders wait while any live intent stands ([`SHARED`]). The
/// key expires with its last live intent. Only that acquisition removes its
/// member: where it wins, in the winning script; elsewhere with this one,
/// once it succeeds, gives up or is cancelled.
pub(crate) const WITHDRAW: Script = Script {
    bit: 32,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/withdraw.lua")
    ),
    sha: "24a6faa72386b30f89ef957ee062a6ccfaac889d",
};

/// Fenced acquisition, round one: `KEYS` are the lock, its fencing counter
/// and its writers' intents; `ARGV` as for [`ACQUIRE_MANY`]. If the lock is
/// taken, it returns 0, and a writer that waited marks its intent where
/// shared or counted holders hold. Otherwise it raises the counter to
/// `max(counter + 1, node clock in µs)`, sets the lock to our value for the
/// TTL, withdraws our intent, and returns the counter. A counter that is not
/// a number fails before the lock is set. The counter never expires. One at
/// 2^53 or above, where Lua loses precision, is refused.
pub(crate) const FENCE_ACQUIRE: Script = Script {
    bit: 64,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/fence_acquire.lua")
    ),
    sha: "775025f0f86002bf5c2fbdcda887f2086935cd59",
};

/// Fenced acquisition, round two. If `KEYS[1]` still holds our token
/// (`ARGV[1]`), it raises the counter `KEYS[2]` to at least `ARGV[2]`. It then
/// returns 1; otherwise it writes nothing and returns 0.
pub(crate) const FENCE_CONFIRM: Script = Script {
    bit: 128,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/fence_confirm.lua")
    ),
    sha: "88476fd753dd71e0fdbbc8b3d289e4e5cbec06fd",
};

/// The shared and counted kinds' acquire, extend, release and clean-up
/// (`ARGV[1]`: `acquire`, `extend`, `release` or `quiet`). Then each lock
/// has four keys (the resource, its writers' intents, its release channel,
/// its holders' owners) and three arguments (the value `TOKEN[ OWNER]` or
/// the token, the TTL in ms, the kind: `0` for readers, else `K`).
///
/// Holders are the tokens in a sorted set at the resource's key, scored by
/// their expiry on the node's clock; their owner labels are in a hash
/// beside it. The set also holds one marker, `redlock-sync:2:kind=K`,
/// scored `-inf`: it is never counted nor purged, and a set without it is
/// an application's, held by another and never written (or another
/// layout's: `LAYOUT`). Every call purges the expired holders. The key
/// expires with its last live holder, and is deleted when the last one
/// leaves, marker and all. So a writer's `SET NX` fails exactly while a
/// holder lives.
///
/// A member is admitted if the set's kind is ours, no writer nor live
/// intent ([`WITHDRAW`]) is there, and fewer than `K` hold. The same
/// command sent again after a closed connection finds its member, and
/// answers 1 again. An
/// extension renews our live member (1); one that is gone answers 3
/// (gone), whatever holds the key now. A release deletes our member (1)
/// and publishes as [`RELEASE`]. `WRONGKIND` comes only where our own
/// entry lives under another kind, or where an acquisition meets one.
/// Extension returns one reply per lock, the others one.
pub(crate) const SHARED: Script = Script {
    bit: 16,
    body: concat!(
        include_str!("lua/prelude.lua"),
        include_str!("lua/shared.lua")
    ),
    sha: "78180af3e775a6bc0d3a628ae7f665c05722ba7c",
};

/// Reads, without writing, the fencing counter, the holders' kind (`K`
/// from a sorted set's marker, `w` for a token-shaped string), the key's
/// Redis type, and the time left of the longest live writer's intent
/// (`-1`: it never expires; `-2`: none). Then each live holder's value and
/// time left: a writer's key, or the set's members by expiry.
///
/// A string is a writer's only if token-shaped: 40 lowercase hex digits,
/// then optionally `~MARK` and ` OWNER`, 258 bytes at most. Any other key,
/// and a sorted set without our marker, is not a lock: its kind is empty.
/// It has no bit: it always goes as `EVAL`, and is never loaded with the
/// lock scripts.
pub(crate) const INSPECT: Script = Script {
    bit: 0,
    body: include_str!("lua/inspect.lua"),
    sha: "d105796292738e89a9dd64ebbf563fb6ca599adf",
};

/// One command, packed once, sent to every node of a round.
pub(crate) struct Command {
    /// The script it runs, if any.
    pub(crate) script: Option<&'static Script>,
    /// The packed command: `EVALSHA ...` for a script, else the command.
    fast: Vec<u8>,
    /// The packed `EVAL ...` form, made only if a connection needs it.
    full: OnceLock<Vec<u8>>,
}

impl Command {
    /// `SET resource value NX PX ttl_ms`.
    pub(crate) fn acquire(resource: &str, value: &str, ttl_ms: u64) -> Command {
        let key = resource.as_bytes();
        let value = value.as_bytes();
        let ttl = ttl_ms.to_string();
        Command::packed(None, &[b"SET", key, value, b"NX", b"PX", ttl.as_bytes()])
    }

    /// A script over `keys` with arguments `args`, as `EVALSHA`.
    pub(crate) fn script(script: &'static Script, keys: &[String], args: &[&[u8]]) -> Command {
        let numkeys = keys.len().to_string();
        let mut parts: Vec<&[u8]> = vec![b"EVALSHA", script.sha.as_bytes(), numkeys.as_bytes()];
        parts.extend(keys.iter().map(|k| k.as_bytes()));
        parts.extend_from_slice(args);
        Command::packed(Some(script), &parts)
    }

    /// The command of `parts`, packed once.
    fn packed(script: Option<&'static Script>, parts: &[&[u8]]) -> Command {
        let size: usize = parts.iter().map(|p| p.len() + 16).sum();
        let mut fast = Vec::with_capacity(size);
        pack(&mut fast, parts);
        Command {
            script,
            fast,
            full: OnceLock::new(),
        }
    }

    /// The bytes to send on a connection that knows the scripts in `known`.
    pub(crate) fn bytes_for(&self, known: u8) -> &[u8] {
        match self.script {
            Some(s) if known & s.bit == 0 => self.full.get_or_init(|| eval_form(s, &self.fast)),
            _ => &self.fast,
        }
    }
}

/// Every script, loaded by every new connection's handshake.
pub(crate) const SCRIPTS: [&Script; 8] = [
    &RELEASE,
    &EXTEND,
    &CONFIRM,
    &ACQUIRE_MANY,
    &FENCE_ACQUIRE,
    &FENCE_CONFIRM,
    &SHARED,
    &WITHDRAW,
];

/// Turns a packed `EVALSHA sha numkeys ...` into `EVAL body numkeys ...`.
fn eval_form(script: &Script, fast: &[u8]) -> Vec<u8> {
    // `*N\r\n`, then `$7\r\nEVALSHA\r\n$40\r\n<40 hex>\r\n`, then the rest.
    const EVALSHA_SHA: usize = b"$7\r\nEVALSHA\r\n$40\r\n".len() + 40 + 2;
    let head = fast.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let rest = fast.get(head + EVALSHA_SHA..).unwrap_or_default();
    let mut body = Vec::with_capacity(script.body.len() + 16);
    pack_bulk(&mut body, script.body.as_bytes());
    [&fast[..head], b"$4\r\nEVAL\r\n", &body[..], rest].concat()
}

/// Appends `args` as one RESP array of bulk strings.
pub(crate) fn pack(out: &mut Vec<u8>, args: &[&[u8]]) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "*{}\r\n", args.len());
    for arg in args {
        pack_bulk(out, arg);
    }
}

/// Appends one RESP bulk string.
fn pack_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    let _ = write!(out, "${}\r\n", arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

/// Whether a reply says the server does not have the script.
pub(crate) fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_writes_resp_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        pack(&mut out, &[b"GET", b"key"]);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
    }

    #[test]
    fn script_command_sends_eval_until_the_script_is_known() {
        let cmd = Command::script(&RELEASE, &["k".to_string()], &[b"tok"]);
        assert!(cmd.bytes_for(0).starts_with(b"*5\r\n$4\r\nEVAL\r\n"));
        assert!(cmd
            .bytes_for(RELEASE.bit)
            .starts_with(b"*5\r\n$7\r\nEVALSHA\r\n"));
    }

    #[test]
    fn every_scripts_hard_coded_sha_is_the_one_script_load_returns() {
        let cluster = redlock_sync_testing::Cluster::start(1).expect("a redis-server node");
        let scripts: [(&str, &Script); 9] = [
            ("RELEASE", &RELEASE),
            ("EXTEND", &EXTEND),
            ("CONFIRM", &CONFIRM),
            ("ACQUIRE_MANY", &ACQUIRE_MANY),
            ("FENCE_ACQUIRE", &FENCE_ACQUIRE),
            ("FENCE_CONFIRM", &FENCE_CONFIRM),
            ("SHARED", &SHARED),
            ("WITHDRAW", &WITHDRAW),
            ("INSPECT", &INSPECT),
        ];
        let mut bits = 0u8;
        let mut wrong = Vec::new();
        for (name, script) in scripts {
            let loaded = cluster
                .node(0)
                .query(&["SCRIPT", "LOAD", script.body])
                .expect("SCRIPT LOAD");
            let got = match loaded {
                redis::Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
                other => panic!("{name}: SCRIPT LOAD answered {other:?}"),
            };
            if script.sha != got {
                wrong.push(format!("{name}: {got}"));
            }
            if script.bit == 0 {
                // Sent as EVAL every time, never loaded.
                continue;
            }
            assert_eq!(bits & script.bit, 0, "{name}: bit {} is taken", script.bit);
            assert_eq!(script.bit.count_ones(), 1, "{name}: one bit per script");
            bits |= script.bit;
        }
        assert!(wrong.is_empty(), "SCRIPT LOAD gives other SHAs: {wrong:?}");
    }

    #[test]
    fn a_confirmation_unmarks_only_the_re_takes_of_its_own_round() {
        let cluster = redlock_sync_testing::Cluster::start(1).expect("a redis-server node");
        let node = cluster.node(0);
        let token = "00112233445566778899aabbccddeeff00112233";
        let ours = format!("{token}~1111111111111111");
        node.set("k", &ours).unwrap();
        node.query(&["PEXPIRE", "k", "60000"]).unwrap();
        let confirm = |mark: &str| {
            node.query(&["EVAL", CONFIRM.body, "1", "k", mark]).unwrap();
        };
        // Another round's mark: a re-take that landed late, never read.
        confirm("2222222222222222");
        assert_eq!(node.get("k").unwrap(), Some(ours));
        confirm("1111111111111111");
        assert_eq!(node.get("k").unwrap().as_deref(), Some(token));
        assert!(node.pttl("k").unwrap() > 50_000, "the TTL is kept");
    }
}
