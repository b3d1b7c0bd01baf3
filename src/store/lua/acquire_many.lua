-- ACQUIRE_MANY: KEYS are the locks, then their writers' intents.
local n = #KEYS / 2
local id = ARGV[3]
for i = 1, n do
  if redis.call('exists', KEYS[i]) == 1 then
    if id then
      local now = now_ms()
      for j = 1, n do
        if redis.call('type', KEYS[j]).ok == 'zset' then
          mark_intent(KEYS[n + j], id, ARGV[2], now)
        end
      end
    end
    return 0
  end
end
for i = 1, n do
  redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])
  if id then
    withdraw_intent(KEYS[n + i], id)
  end
end
return 1
