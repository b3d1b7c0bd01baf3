-- EXTEND: ARGV[1] is the round's re-take mark, then four arguments a lock.
local mark = ARGV[1]
local out = {}
local k = 0
for g = 2, #ARGV, 4 do
  local n = tonumber(ARGV[g])
  local value = ARGV[g + 1]
  local fence = tonumber(ARGV[g + 3])
  local token = string.sub(value, 1, 40)
  local locks = n
  if (fence or 0) > 0 then
    locks = n - 1
  end
  local vote = 1
  for i = k + 1, k + locks do
    local v = redis.pcall('get', KEYS[i])
    if type(v) == 'table' then
      vote = 0
      local kind = set_kind(KEYS[i])
      if kind and has_member(KEYS[i], token) then
        vote = wrong_kind(kind)
      end
    elseif v and not holds(v, token) then
      vote = 0
    elseif (not v or string.byte(v, 41) == 126) and vote == 1 then
      vote = fence and 2 or 3
    end
  end
  local writes = vote == 1 or vote == 2
  local counter = writes and locks < n and tonumber(redis.call('get', KEYS[k + n]) or '0')
  if counter == nil then
    vote = redis.error_reply('the fencing counter is not a number')
  elseif writes then
    if counter and counter < fence then
      redis.call('set', KEYS[k + n], ARGV[g + 3])
    end
    local marked = token .. '~' .. mark .. string.sub(value, 41)
    for i = k + 1, k + locks do
      if vote == 1 then
        redis.call('pexpire', KEYS[i], ARGV[g + 2])
      else
        redis.call('set', KEYS[i], marked, 'PX', ARGV[g + 2])
      end
    end
  end
  out[#out + 1] = vote
  k = k + n
end
return out
