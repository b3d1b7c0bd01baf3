-- CONFIRM: ARGV[1] is the round's re-take mark.
local tail = '~' .. ARGV[1]
for _, key in ipairs(KEYS) do
  local value = redis.pcall('get', key)
  if type(value) == 'string' and string.sub(value, 41, 40 + #tail) == tail then
    redis.call('set', key, string.sub(value, 1, 40) .. string.sub(value, 41 + #tail), 'KEEPTTL')
  end
end
return 0
