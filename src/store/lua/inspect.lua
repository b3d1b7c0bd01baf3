-- INSPECT: KEYS are the resource, its fencing counter, its intents and an
-- older client's intent. It writes nothing.
local MARKER = 'redlock-sync:kind='
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
local out = {redis.call('get', KEYS[2]) or '', '', t, intent}
if t == 'zset' then
  local first = redis.call('zrange', KEYS[1], 0, 0)[1]
  if first and string.sub(first, 1, #MARKER) == MARKER then
    out[2] = string.sub(first, #MARKER + 1)
    local z = redis.call('zrangebyscore', KEYS[1], '(' .. now, '+inf', 'withscores')
    for i = 1, #z, 2 do
      out[#out + 1] = z[i]
      out[#out + 1] = z[i + 1] - now
    end
  end
elseif t == 'string' and redis.call('strlen', KEYS[1]) <= 258 then
  local v = redis.call('get', KEYS[1])
  local rest = string.gsub(string.sub(v, 41), '^~[0-9a-f]+', '', 1)
  if #v >= 40 and string.find(string.sub(v, 1, 40), '^[0-9a-f]+$')
    and (rest == '' or string.sub(rest, 1, 1) == ' ') then
    out[2] = 'w'
    out[5] = v
    out[6] = redis.call('pttl', KEYS[1])
  end
end
return out
