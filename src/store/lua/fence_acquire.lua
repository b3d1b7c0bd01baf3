-- FENCE_ACQUIRE: KEYS are the lock, its fencing counter, its intents.
local id = ARGV[3]
local time = redis.call('time')
if redis.call('exists', KEYS[1]) == 1 then
  if id and redis.call('type', KEYS[1]).ok == 'zset' then
    mark_intent(KEYS[3], id, ARGV[2], time[1] * 1000 + math.floor(time[2] / 1000))
  end
  return 0
end
local fence = redis.call('incr', KEYS[2])
local micros = time[1] .. string.format('%06d', time[2])
if tonumber(micros) > fence then
  redis.call('set', KEYS[2], micros)
  fence = tonumber(micros)
end
if fence >= 9007199254740992 then
  return redis.error_reply('fencing counter reached 2^53')
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
if id then
  withdraw_intent(KEYS[3], id)
end
return fence
