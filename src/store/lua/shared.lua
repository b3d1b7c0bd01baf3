-- SHARED: ARGV[1] is the operation, then three arguments a lock (the value
-- TOKEN[ OWNER], the TTL, the kind); KEYS are five a lock: the resource,
-- its intents, an older client's intent, its release channel, its owners.
local op = ARGV[1]
local now = now_ms()
local out = {}

-- The set and its owners expire with its last live holder; with none,
-- they go.
local function keep_expiry(key, owners)
  if redis.call('zcard', key) <= 1 then
    redis.call('del', key, owners)
  else
    local top = redis.call('zrange', key, -1, -1, 'withscores')[2]
    redis.call('pexpireat', key, top)
    if redis.call('exists', owners) == 1 then
      redis.call('pexpireat', owners, top)
    end
  end
end

-- Removes the expired holders, and their owners.
local function purge(key, owners)
  local gone = redis.call('zrangebyscore', key, '(-inf', now)
  if #gone > 0 then
    redis.call('zremrangebyscore', key, '(-inf', now)
    for first = 1, #gone, 1000 do
      redis.call('hdel', owners, unpack(gone, first, math.min(first + 999, #gone)))
    end
  end
end

-- Whether a writer waits: a live intent, or an older client's.
local function writer_waits(intents, older)
  if redis.call('exists', older) == 1 then
    return true
  end
  redis.call('zremrangebyscore', intents, '-inf', now)
  return redis.call('exists', intents) == 1
end

local i = 0
for g = 2, #ARGV, 3 do
  local key, intents, older = KEYS[i + 1], KEYS[i + 2], KEYS[i + 3]
  local channel, owners = KEYS[i + 4], KEYS[i + 5]
  i = i + 5
  local value, ttl, k = ARGV[g], ARGV[g + 1], ARGV[g + 2]
  local token = string.sub(value, 1, 40)
  local owner = string.sub(value, 42)
  local t = redis.call('type', key).ok
  -- Our set's kind, and whether our member lives in it.
  local held, layout = set_kind(key)
  local mine = false
  if held then
    purge(key, owners)
    mine = has_member(key, token)
  end
  local vote = 0
  if mine and held ~= k then
    vote = wrong_kind(held)
  elseif op ~= 'acquire' and t == 'string' and holds(redis.call('get', key), token) then
    vote = wrong_kind(nil)
  elseif op == 'extend' then
    vote = 3
    if mine then
      redis.call('zadd', key, now + ttl, token)
      vote = 1
    end
  elseif op ~= 'acquire' then
    if mine then
      redis.call('zrem', key, token)
      redis.call('hdel', owners, token)
      vote = 1
    end
    if op == 'release' and (mine or t == 'none') then
      redis.pcall('publish', channel, token)
    end
  elseif held and held ~= k then
    vote = wrong_kind(held)
  elseif layout then
    vote = redis.error_reply('LAYOUT ' .. layout)
  elseif (held or t == 'none') and not writer_waits(intents, older) then
    if t == 'none' then
      redis.call('zadd', key, '-inf', MARKER .. k)
    end
    if k == '0' or redis.call('zcard', key) - 1 < tonumber(k) then
      redis.call('zadd', key, now + ttl, token)
      if owner ~= '' then
        redis.call('hset', owners, token, owner)
      end
      vote = 1
    end
  end
  if held or vote == 1 then
    keep_expiry(key, owners)
  end
  out[#out + 1] = vote
end
if op == 'extend' then
  return out
end
return out[1]
