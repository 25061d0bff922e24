-- Renew a batch of locks, each only if it is still held by the given token.
--
-- KEYS[i]    the lock keys
-- ARGV[1]    the new lease in milliseconds (>= 1; PEXPIRE with 0 or less would delete the key)
-- ARGV[2]    '1': set the lease exactly (an explicit extension, which may shorten it); '0': set
--            it only where it grows (a watchdog renewal or a handoff's confirmation must never
--            cut back a longer extension its holder was told about)
-- ARGV[i+2]  the token expected in KEYS[i]
--
-- Returns an array with one entry per key:
--   1  renewed
--   0  the key is absent (it expired, or was deleted or forgotten)
--  -1  the key holds another token (taken over), or is of another type
local lease = tonumber(ARGV[1])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
local exact = ARGV[2] == '1'
local result = {}
for i, key in ipairs(KEYS) do
  local ok, current = pcall(redis.call, 'GET', key)
  if ok and current == ARGV[i + 2] then
    if exact or redis.call('PTTL', key) < lease then
      redis.call('PEXPIRE', key, lease)
    end
    result[i] = 1
  elseif ok and not current then
    result[i] = 0
  else
    result[i] = -1
  end
end
return result
