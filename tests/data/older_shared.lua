-- The shared and counted kinds' script of an older client of this crate
-- (layout 1: members TOKEN[ OWNER], the kind in redlock-sync:kind:R), kept to
-- test a newer client beside it (tests/older_client.rs).
local time = redis.call('time')
local now, op, out = time[1] * 1000 + math.floor(time[2] / 1000), ARGV[1], {}
for g = 2, #ARGV, 3 do
  local key, intent, kind, member, ttl, k = KEYS[g - 1], KEYS[g], KEYS[g + 1], ARGV[g], ARGV[g + 1], ARGV[g + 2]
  local token, t, held, vote, mine = string.sub(member, 1, 40), redis.call('type', key).ok, redis.call('get', kind), 0
  if t == 'zset' and held then
    redis.call('zremrangebyscore', key, '-inf', now)
    for _, m in ipairs(redis.call('zrange', key, 0, -1)) do
      if string.sub(m, 1, 40) == token then mine = m end
    end
  end
  if t ~= 'none' and not (t == 'zset' and held) then
    if t == 'string' and string.sub(redis.call('get', key), 1, 40) == token then vote = redis.error_reply('WRONGKIND a plain or fenced lock') end
  elseif held and held ~= k and redis.call('exists', key) == 1 then
    vote = redis.error_reply('WRONGKIND ' .. (held == '0' and 'a shared lock' or 'a semaphore of ' .. held .. ' permits'))
  elseif op == 'extend' then
    vote = mine and 1 or 3
    if mine then redis.call('zadd', key, now + ttl, mine) end
  elseif op ~= 'acquire' then
    if mine then redis.call('zrem', key, mine) vote = 1 end
    if op == 'release' and (mine or t == 'none') then redis.pcall('publish', 'redlock-sync:released:' .. key, token) end
  elseif not mine and redis.call('exists', intent) == 0 and (k == '0' or redis.call('zcard', key) < tonumber(k)) then
    redis.call('zadd', key, now + ttl, member)
    vote = 1
  end
  if vote == 1 and redis.call('exists', key) == 1 then
    local top = redis.call('zrange', key, -1, -1, 'withscores')[2]
    redis.call('pexpireat', key, top)
    redis.call('set', kind, k, 'pxat', top)
  end
  out[#out + 1] = vote
end
if op == 'extend' then return out end
return out[1]
