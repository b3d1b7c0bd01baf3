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

/// The channel on which a release of resource `r` is announced is this
/// prefix, then `r`. The crate's reserved prefix keeps application channels
/// apart.
pub(crate) const RELEASED_CHANNEL_PREFIX: &str = "redlock-sync:released:";

/// A clean-up's second argument to the release script: publish nothing.
pub(crate) const QUIET: &[u8] = b"quiet";

/// Deletes each key whose value is our token. Returns how many of those
/// were unmarked. The node held the lock if that equals the key count. For
/// one key this is the classic `if get == token then del` script.
///
/// Each deleted key is announced in the same call: a `PUBLISH` of the token
/// on its channel ([`RELEASED_CHANNEL_PREFIX`]). An unheard `PUBLISH` costs
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
/// A holder's release also deletes the writers' intents ([`ACQUIRE_MANY`])
/// on every node: one left where it lost would keep readers out for a TTL.
/// A writer still waiting sets its intent again at its next attempt.
///
/// A key of another type is held by another, unless our token is among its
/// members: then it is the wrong kind's release (`WRONGKIND`, an error).
pub(crate) const RELEASE: Script = Script {
    bit: 1,
    body: "local n = 0\n\
           for _, key in ipairs(KEYS) do\n  \
           local v = redis.pcall('get', key)\n  \
           if type(v) == 'table' then\n    \
           for _, m in ipairs(redis.pcall('zrange', key, 0, -1)) do\n      \
           if string.sub(m, 1, 40) == ARGV[1] then return redis.error_reply('WRONGKIND a shared lock or a semaphore') end\n    \
           end\n    \
           v = '-'\n  \
           end\n  \
           local ours = v and string.sub(v, 1, 40) == ARGV[1]\n  \
           if ours then\n    \
           redis.call('del', key)\n    \
           if string.byte(v, 41) ~= 126 then n = n + 1 end\n  \
           end\n  \
           if ARGV[2] == nil then redis.call('del', 'redlock-sync:intent:' .. key) end\n  \
           if ARGV[2] == nil and (ours or v == false) then\n    \
           redis.pcall('publish', 'redlock-sync:released:' .. key, ARGV[1])\n  \
           end\n\
           end\n\
           return n",
    sha: "2c4b8aae63060934e5126944f1f1d4c970cdee76",
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
    body: "local mark, out, k = ARGV[1], {}, 0\n\
           for g = 2, #ARGV, 4 do\n  \
             local n, value, fence = tonumber(ARGV[g]), ARGV[g + 1], tonumber(ARGV[g + 3])\n  \
             local token, locks, vote = string.sub(value, 1, 40), n - ((fence or 0) > 0 and 1 or 0), 1\n  \
             for i = k + 1, k + locks do\n    \
               local v = redis.pcall('get', KEYS[i])\n    \
               if type(v) == 'table' then\n      \
                 vote = 0\n      \
                 for _, m in ipairs(redis.pcall('zrange', KEYS[i], 0, -1)) do\n        \
                   if string.sub(m, 1, 40) == token then vote = redis.error_reply('WRONGKIND a shared lock or a semaphore') end\n      \
                 end\n    \
               elseif v and string.sub(v, 1, 40) ~= token then vote = 0\n    \
               elseif (not v or string.byte(v, 41) == 126) and vote == 1 then vote = fence and 2 or 3 end\n  \
             end\n  \
             local writes = vote == 1 or vote == 2\n  \
             local counter = writes and locks < n and tonumber(redis.call('get', KEYS[k + n]) or '0')\n  \
             if counter == nil then\n    \
               vote = redis.error_reply('the fencing counter is not a number')\n  \
             elseif writes then\n    \
               if counter and counter < fence then redis.call('set', KEYS[k + n], ARGV[g + 3]) end\n    \
               local marked = token .. '~' .. mark .. string.sub(value, 41)\n    \
               for i = k + 1, k + locks do\n      \
                 if vote == 1 then redis.call('pexpire', KEYS[i], ARGV[g + 2])\n      \
                 else redis.call('set', KEYS[i], marked, 'PX', ARGV[g + 2]) end\n    \
               end\n  \
             end\n  \
             out[#out + 1], k = vote, k + n\n\
           end\n\
           return out",
    sha: "729392c39308d683f65eb7cb011c8210b5f67501",
};

/// Confirms one round's re-takes: a key marked with `ARGV[1]` (see
/// [`EXTEND`]) loses the mark, its TTL kept. It goes only where a round
/// that held read the re-take's reply. A re-take elsewhere keeps its mark,
/// and never counts as renewed.
pub(crate) const CONFIRM: Script = Script {
    bit: 8,
    body: "local tail = '~' .. ARGV[1]\n\
           for _, key in ipairs(KEYS) do\n  \
             local v = redis.pcall('get', key)\n  \
             if type(v) == 'string' and string.sub(v, 41, 40 + #tail) == tail then\n    \
               redis.call('set', key, string.sub(v, 1, 40) .. string.sub(v, 41 + #tail), 'KEEPTTL')\n  \
             end\n\
           end\n\
           return 0",
    sha: "a76b832a4e034fb7a114a100091b41d72b4fab4f",
};

/// A writer's acquisition: `KEYS` are the locks, then their intent keys.
/// Sets every lock to our value with a TTL, if none of them exists, and
/// deletes the intents: returns 1. Else returns 0, and a writer that waited
/// (`ARGV[3]`) sets the intent of each lock that readers hold, for one
/// TTL: new readers wait ([`SHARED`]).
pub(crate) const ACQUIRE_MANY: Script = Script {
    bit: 4,
    body: "local n = #KEYS / 2\n\
           for i = 1, n do\n  \
             if redis.call('exists', KEYS[i]) == 1 then\n    \
               for j = 1, n do\n      \
                 if ARGV[3] and redis.call('type', KEYS[j]).ok == 'zset' then redis.call('set', KEYS[n + j], 1, 'PX', ARGV[2]) end\n    \
               end\n    \
               return 0\n  \
             end\n\
           end\n\
           for i = 1, n do\n  \
             redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])\n  \
             redis.call('del', KEYS[n + i])\n\
           end\n\
           return 1",
    sha: "b8f62e61a18900736f5fef3344f70e7e5fa660e4",
};

/// Fenced acquisition, round one. If the lock key (`KEYS[1]`) is taken, it
/// returns 0 and writes nothing. Otherwise it raises the fencing counter
/// (`KEYS[2]`) to `max(counter + 1, node clock in µs)`. It sets the lock to
/// our token (`ARGV[1]`) for `ARGV[2]` ms, and returns the counter. A counter
/// that is not a number fails before the lock is set. The counter never
/// expires. One at 2^53 or above, where Lua loses precision, is refused.
pub(crate) const FENCE_ACQUIRE: Script = Script {
    bit: 64,
    body: "if redis.call('exists', KEYS[1]) == 1 then\n  \
             if ARGV[3] and redis.call('type', KEYS[1]).ok == 'zset' then redis.call('set', KEYS[3], 1, 'PX', ARGV[2]) end\n  \
             return 0\n\
           end\n\
           redis.call('del', KEYS[3])\n\
           local fence = redis.call('incr', KEYS[2])\n\
           local time = redis.call('time')\n\
           local now = time[1] .. string.format('%06d', time[2])\n\
           if tonumber(now) > fence then\n  \
             redis.call('set', KEYS[2], now)\n  \
             fence = tonumber(now)\n\
           end\n\
           if fence >= 9007199254740992 then\n  \
             return redis.error_reply('fencing counter reached 2^53')\n\
           end\n\
           redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])\n\
           return fence",
    sha: "019626b11d8dc566d4dbb210d80e70612b7c2a19",
};

/// Fenced acquisition, round two. If `KEYS[1]` still holds our token
/// (`ARGV[1]`), it raises the counter `KEYS[2]` to at least `ARGV[2]`. It then
/// returns 1; otherwise it writes nothing and returns 0.
pub(crate) const FENCE_CONFIRM: Script = Script {
    bit: 128,
    body: "if redis.pcall('get', KEYS[1]) ~= ARGV[1] then\n  \
             return 0\n\
           end\n\
           if tonumber(redis.call('get', KEYS[2]) or '0') < tonumber(ARGV[2]) then\n  \
             redis.call('set', KEYS[2], ARGV[2])\n\
           end\n\
           return 1",
    sha: "a3aa0470c63eef94e11a50eb881ab3983a7cc6cc",
};

/// The shared and counted kinds' acquire, extend, release and clean-up
/// (`ARGV[1]`: `acquire`, `extend`, `release` or `quiet`). Then each lock
/// has three keys (the resource, its writer's intent, its kind) and three
/// arguments (the member or token, the TTL in ms, the kind: `0` for
/// readers, else `K`).
///
/// Holders are the members of a sorted set at the resource's key, scored
/// by their expiry on the node's clock. Every call purges the expired
/// ones, and the key expires with its last live member. So a writer's
/// `SET NX` fails exactly while a holder lives. The kind key keeps `0` or
/// `K` as long. A call of another kind is a `WRONGKIND` error.
///
/// A member is admitted if it is new, no writer or intent is there, and
/// fewer than `K` live. An extension renews a live member (1) and never
/// re-takes one that is gone (3). A writer's key answers 0. Release
/// deletes our member and publishes as [`RELEASE`]. Extension returns one
/// reply per lock, the others one.
pub(crate) const SHARED: Script = Script {
    bit: 16,
    body: "local time = redis.call('time')\n\
           local now, op, out = time[1] * 1000 + math.floor(time[2] / 1000), ARGV[1], {}\n\
           for g = 2, #ARGV, 3 do\n  \
             local key, intent, kind, member, ttl, k = KEYS[g - 1], KEYS[g], KEYS[g + 1], ARGV[g], ARGV[g + 1], ARGV[g + 2]\n  \
             local token, t, held, vote, mine = string.sub(member, 1, 40), redis.call('type', key).ok, redis.call('get', kind), 0\n  \
             if t == 'zset' and held then\n    \
               redis.call('zremrangebyscore', key, '-inf', now)\n    \
               for _, m in ipairs(redis.call('zrange', key, 0, -1)) do\n      \
                 if string.sub(m, 1, 40) == token then mine = m end\n    \
               end\n  \
             end\n  \
             if t ~= 'none' and not (t == 'zset' and held) then\n    \
               if t == 'string' and string.sub(redis.call('get', key), 1, 40) == token then vote = redis.error_reply('WRONGKIND a plain or fenced lock') end\n  \
             elseif held and held ~= k and redis.call('exists', key) == 1 then\n    \
               vote = redis.error_reply('WRONGKIND ' .. (held == '0' and 'a shared lock' or 'a semaphore of ' .. held .. ' permits'))\n  \
             elseif op == 'extend' then\n    \
               vote = mine and 1 or 3\n    \
               if mine then redis.call('zadd', key, now + ttl, mine) end\n  \
             elseif op ~= 'acquire' then\n    \
               if mine then redis.call('zrem', key, mine) vote = 1 end\n    \
               if op == 'release' and (mine or t == 'none') then redis.pcall('publish', 'redlock-sync:released:' .. key, token) end\n  \
             elseif not mine and redis.call('exists', intent) == 0 and (k == '0' or redis.call('zcard', key) < tonumber(k)) then\n    \
               redis.call('zadd', key, now + ttl, member)\n    \
               vote = 1\n  \
             end\n  \
             if vote == 1 and redis.call('exists', key) == 1 then\n    \
               local top = redis.call('zrange', key, -1, -1, 'withscores')[2]\n    \
               redis.call('pexpireat', key, top)\n    \
               redis.call('set', kind, k, 'pxat', top)\n  \
             end\n  \
             out[#out + 1] = vote\n\
           end\n\
           if op == 'extend' then return out end\n\
           return out[1]",
    sha: "e93bd1da9d93f44e35a9b7a98de9353e370baa1f",
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
        let (key, value, ttl) = (resource.as_bytes(), value.as_bytes(), ttl_ms.to_string());
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
pub(crate) const SCRIPTS: [&Script; 7] = [
    &RELEASE,
    &EXTEND,
    &CONFIRM,
    &ACQUIRE_MANY,
    &FENCE_ACQUIRE,
    &FENCE_CONFIRM,
    &SHARED,
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
    fn the_release_script_publishes_on_the_channels_waiters_listen_on() {
        let publish =
            format!("redis.pcall('publish', '{RELEASED_CHANNEL_PREFIX}' .. key, ARGV[1])");
        assert!(RELEASE.body.contains(&publish), "{}", RELEASE.body);
    }

    #[test]
    fn every_scripts_hard_coded_sha_is_the_one_script_load_returns() {
        let cluster = redlock_sync_testing::Cluster::start(1).expect("a redis-server node");
        let scripts: [(&str, &Script); 7] = [
            ("RELEASE", &RELEASE),
            ("EXTEND", &EXTEND),
            ("CONFIRM", &CONFIRM),
            ("ACQUIRE_MANY", &ACQUIRE_MANY),
            ("FENCE_ACQUIRE", &FENCE_ACQUIRE),
            ("FENCE_CONFIRM", &FENCE_CONFIRM),
            ("SHARED", &SHARED),
        ];
        let mut bits = 0u8;
        for (name, script) in scripts {
            let loaded = cluster
                .node(0)
                .query(&["SCRIPT", "LOAD", script.body])
                .expect("SCRIPT LOAD");
            let got = match loaded {
                redis::Value::BulkString(bytes) => String::from_utf8(bytes).unwrap(),
                other => panic!("{name}: SCRIPT LOAD answered {other:?}"),
            };
            assert_eq!(
                script.sha, got,
                "{name}: hard-coded sha (left) vs SCRIPT LOAD (right)"
            );
            assert_eq!(bits & script.bit, 0, "{name}: bit {} is taken", script.bit);
            assert_eq!(script.bit.count_ones(), 1, "{name}: one bit per script");
            bits |= script.bit;
        }
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
