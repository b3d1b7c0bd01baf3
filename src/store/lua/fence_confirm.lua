-- FENCE_CONFIRM: KEYS are the lock and its fencing counter.
if redis.pcall('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(redis.call('get', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('set', KEYS[2], ARGV[2])
end
return 1
