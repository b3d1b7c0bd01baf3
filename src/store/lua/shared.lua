-- SHARED: ARGV[1] is the operation, then three arguments a lock; KEYS are
-- four a lock: the resource, its intents, an older client's intent, and
-- its release channel.
local op = ARGV[1]
local now = now_ms()
local out = {}

-- The set expires with its last live holder; with none, it goes.
local function keep_expiry(key)
  if redis.call('zcard', key) <= 1 then
    redis.call('del', key)
  else
    expire_with_last(key)
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
  local key, intents, older, channel = KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], KEYS[i + 4]
  i = i + 4
  local member, ttl, k = ARGV[g], ARGV[g + 1], ARGV[g + 2]
  local token = string.sub(member, 1, 40)
  local t = redis.call('type', key).ok
  -- Our set's kind, and our live member in it.
  local held = set_kind(key)
  local mine
  if held then
    redis.call('zremrangebyscore', key, '(-inf', now)
    mine = member_of(key, token)
  end
  local vote = 0
  if mine and held ~= k then
    vote = wrong_kind(held)
  elseif op ~= 'acquire' and t == 'string' and holds(redis.call('get', key), token) then
    vote = wrong_kind(nil)
  elseif op == 'extend' then
    vote = 3
    if mine then
      redis.call('zadd', key, now + ttl, mine)
      vote = 1
    end
  elseif op ~= 'acquire' then
    if mine then
      redis.call('zrem', key, mine)
      vote = 1
    end
    if op == 'release' and (mine or t == 'none') then
      redis.pcall('publish', channel, token)
    end
  elseif held and held ~= k then
    vote = wrong_kind(held)
  elseif (held or t == 'none') and not writer_waits(intents, older) then
    if t == 'none' then
      redis.call('zadd', key, '-inf', MARKER .. k)
    end
    if k == '0' or redis.call('zcard', key) - 1 < tonumber(k) then
      redis.call('zadd', key, now + ttl, member)
      vote = 1
    end
  end
  if held or vote == 1 then
    keep_expiry(key)
  end
  out[#out + 1] = vote
end
if op == 'extend' then
  return out
end
return out[1]
