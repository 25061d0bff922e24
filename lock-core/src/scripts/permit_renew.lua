-- Renew a batch of semaphore holders, each only if its lease has not ended.
--
-- KEYS[i]   the semaphores' sets (see permit_acquire.lua)
-- ARGV[1]   the new lease in milliseconds (>= 1)
-- ARGV[2]   '1': set the holder's lease exactly (an explicit extension, which may shorten it);
--           '0': only where it grows (a watchdog renewal never cuts back an extension)
-- ARGV[i+2] the holder in KEYS[i]: `<token>|<holder>:<permits>`
--
-- Returns an array with one entry per key:
--   1  renewed
--   0  the holder is not in the set (its lease ended and it was cleared, or the set was
--      deleted)
--  -1  the key is of another type
--  -2  the holder is there but its lease had ended
local lease = tonumber(ARGV[1])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
local now = server_ms()
local exact = ARGV[2] == '1'
local result = {}
for i, key in ipairs(KEYS) do
  local ok, score = pcall(redis.call, 'ZSCORE', key, ARGV[i + 2])
  score = ok and tonumber(score or '')
  if not ok then
    result[i] = -1
  elseif not score then
    result[i] = 0
  elseif score <= now then
    result[i] = -2
  else
    local until_ms = now + lease
    if not exact then
      until_ms = math.max(until_ms, score)
    end
    redis.call('ZADD', key, 'XX', string.format('%.0f', until_ms), ARGV[i + 2])
    redis.call('PEXPIRE', key, until_ms - now, 'GT')
    result[i] = 1
  end
end
return result
