-- RELEASE: KEYS are the locks, then (unless quiet) their release channels.
-- 1: every key held our token, unmarked.
local token = ARGV[1]
local quiet = ARGV[2] ~= nil
local locks = quiet and #KEYS or #KEYS / 2
local deleted = 0
for i = 1, locks do
  local key = KEYS[i]
  local value = redis.pcall('get', key)
  if type(value) == 'table' then
    local kind = set_kind(key)
    if kind and has_member(key, token) then
      return wrong_kind(kind)
    end
    value = '-'
  end
  local ours = holds(value, token)
  if ours then
    redis.call('del', key)
    if string.byte(value, 41) ~= 126 then
      deleted = deleted + 1
    end
  end
  if not quiet and (ours or value == false) then
    redis.pcall('publish', KEYS[locks + i], token)
  end
end
if deleted == locks then
  return 1
end
return 0
