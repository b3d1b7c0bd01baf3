-- INSPECT: KEYS are the resource, its fencing counter, its intents, an
-- older client's intent and its holders' owners. It writes nothing. Reply:
-- the counter, the kind, the type, the intent's time left, the holders'
-- count, then each holder shown: its value, its time left, its owner.
local MARKER = 'redlock-sync:2:kind='
local time = redis.call('time')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local t = redis.call('type', KEYS[1]).ok
local intent = -2
if redis.call('type', KEYS[3]).ok == 'zset' then
  local top = redis.call('zrange', KEYS[3], -1, -1, 'withscores')[2]
  if top and tonumber(top) > now then
    intent = top - now
  end
end
local older = redis.call('pttl', KEYS[4])
if older == -1 or (intent ~= -1 and older > intent) then
  intent = older
end
local out = {redis.call('get', KEYS[2]) or '', '', t, intent, 0}
if t == 'zset' then
  local first = redis.call('zrange', KEYS[1], 0, 0)[1]
  if first and string.sub(first, 1, #MARKER) == MARKER then
    out[2] = string.sub(first, #MARKER + 1)
    out[5] = redis.call('zcount', KEYS[1], '(' .. now, '+inf')
    local z = redis.call('zrangebyscore', KEYS[1], '(' .. now, '+inf', 'withscores', 'limit', 0, 100)
    for i = 1, #z, 2 do
      out[#out + 1] = z[i]
      out[#out + 1] = z[i + 1] - now
      out[#out + 1] = redis.call('hget', KEYS[5], z[i]) or ''
    end
  end
elseif t == 'string' and redis.call('strlen', KEYS[1]) <= 258 then
  local v = redis.call('get', KEYS[1])
  local rest = string.gsub(string.sub(v, 41), '^~[0-9a-f]+', '', 1)
  if #v >= 40 and string.find(string.sub(v, 1, 40), '^[0-9a-f]+$')
    and (rest == '' or string.sub(rest, 1, 1) == ' ') then
    out[2] = 'w'
    out[5] = 1
    out[6] = v
    out[7] = redis.call('pttl', KEYS[1])
    out[8] = ''
  end
end
return out
