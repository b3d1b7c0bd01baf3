-- The prelude of every script of redlock-sync: what they share. The keys
-- and values it reads are in the table at the head of src/store.rs. A
-- writer's value is TOKEN[~MARK][ OWNER]: the token is its first 40 bytes.
-- A holders' set's members are tokens; their owners are in a hash.

-- A holders' set's marker member: this prefix, with the layout's version
-- (2), then its kind.
local MARKER = 'redlock-sync:2:kind='

-- The node's clock, in ms.
local function now_ms()
  local time = redis.call('time')
  return time[1] * 1000 + math.floor(time[2] / 1000)
end

-- Whether a stored value holds the token.
local function holds(value, token)
  return type(value) == 'string' and string.sub(value, 1, 40) == token
end

-- The error of a call of the wrong kind, where a lock of `kind` is: a
-- holders' set's ('0' for readers, else K), or nil for a writer's key.
local function wrong_kind(kind)
  if kind == nil then
    return redis.error_reply('WRONGKIND a plain or fenced lock')
  elseif kind == '0' then
    return redis.error_reply('WRONGKIND a shared lock')
  end
  return redis.error_reply('WRONGKIND a semaphore of ' .. kind .. ' permits')
end

-- Whether a value is token-shaped: 40 lowercase hex digits, then nothing
-- or a space and an owner label.
local function token_shaped(value)
  return #value >= 40 and string.find(string.sub(value, 1, 40), '^[0-9a-f]+$') ~= nil
    and (#value == 40 or string.sub(value, 41, 41) == ' ')
end

-- The kind of a holders' set, from its marker; nil for any other key. A
-- set of another layout of this crate gives nil and that layout's name:
-- one with another marker, or an older client's, whose members are
-- token-shaped values and which has no marker.
local function set_kind(key)
  if redis.call('type', key).ok ~= 'zset' then
    return nil
  end
  local first = redis.call('zrange', key, 0, 0)[1]
  if string.sub(first, 1, #MARKER) == MARKER then
    return string.sub(first, #MARKER + 1)
  elseif string.sub(first, 1, 13) == 'redlock-sync:' then
    return nil, 'the layout of ' .. first
  elseif token_shaped(first) then
    return nil, 'layout 1'
  end
  return nil
end

-- Whether a holders' set has the token as a member.
local function has_member(key, token)
  return redis.call('zscore', key, token) ~= false
end

-- A sorted set expires with its member of the largest score.
local function expire_with_last(key)
  local top = redis.call('zrange', key, -1, -1, 'withscores')[2]
  redis.call('pexpireat', key, top)
end

-- A waiting writer marks its intent until `ttl` ms from `now`.
local function mark_intent(intents, id, ttl, now)
  redis.call('zadd', intents, now + ttl, id)
  expire_with_last(intents)
end

-- A writer's acquisition withdraws its intent.
local function withdraw_intent(intents, id)
  if redis.call('zrem', intents, id) == 1 and redis.call('exists', intents) == 1 then
    expire_with_last(intents)
  end
end

