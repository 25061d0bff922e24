-- Renew a batch of locks, each only if it is still held by the given token, and carry each
-- lock's fence key along.
--
-- KEYS[2i-1] the lock keys
-- KEYS[2i]   their fence keys (the last fencing token, see fence.lua)
-- ARGV[1]    the new lease in milliseconds (>= 1; PEXPIRE with 0 or less would delete the key)
-- ARGV[2]    '1': set the lease exactly (an explicit extension, which may shorten it); '0': set
--            it only where it grows (a watchdog renewal or a handoff's confirmation must never
--            cut back a longer extension its holder was told about)
-- ARGV[3]    the fence window in milliseconds (>= 1): a fence key lives at least this long
--            past its lock
-- ARGV[i+3]  the token expected in KEYS[2i-1]
--
-- Returns an array with one entry per lock:
--   1  renewed
--   0  the key is absent (it expired, or was deleted or forgotten)
--  -1  the key holds another token (taken over), or is of another type
--
-- A fence key that exists (the holder asked for a token) is made to live until the lock's new
-- end plus the window, never shorter than it would: fencing state lasts as long as the locks
-- held now plus the window, and a long hold keeps its counter.
local lease = tonumber(ARGV[1])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
local exact = ARGV[2] == '1'
local window = tonumber(ARGV[3])
if not window or window < 1 then
  return redis.error_reply('ERR fence window must be at least 1 ms')
end
local result = {}
for i = 1, #KEYS / 2 do
  local key = KEYS[2 * i - 1]
  local fence = KEYS[2 * i]
  local ok, current = pcall(redis.call, 'GET', key)
  if ok and current == ARGV[i + 3] then
    local ttl = redis.call('PTTL', key)
    if exact or ttl < lease then
      redis.call('PEXPIRE', key, lease)
      ttl = lease
    end
    local fence_ttl = redis.call('PTTL', fence)
    if fence_ttl > 0 and fence_ttl < ttl + window then
      redis.call('PEXPIRE', fence, ttl + window)
    end
    result[i] = 1
  elseif ok and not current then
    result[i] = 0
  else
    result[i] = -1
  end
end
return result
