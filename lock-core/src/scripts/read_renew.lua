-- Renew a batch of read locks, each only if its reader's lease has not ended.
--
-- KEYS[2i-1]  the lock keys (holding the marker "readers", see read_acquire.lua)
-- KEYS[2i]    the readers set of KEYS[2i-1], in its hash slot (declared, see acquire.lua)
-- ARGV[1]     the new lease in milliseconds (>= 1)
-- ARGV[2]     '1': set the reader's lease exactly (an explicit extension, which may shorten
--             it); '0': only where it grows (a watchdog renewal never cuts back an extension)
-- ARGV[i+2]   the reader's token for KEYS[2i-1]
--
-- Returns an array with one entry per lock key:
--   1  renewed
--   0  the lock key or the reader's entry is absent (expired and cleared, or deleted)
--  -1  the lock key holds something else than the marker (a writer's token), or is of another
--      type
--  -2  the reader's entry is there but its lease had ended
local lease = tonumber(ARGV[1])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
local now = server_ms()
local exact = ARGV[2] == '1'
local result = {}
for i = 1, #KEYS / 2 do
  local key, readers, token = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 2]
  local ok, current = pcall(redis.call, 'GET', key)
  result[i] = 0
  if not ok or (current and current ~= 'readers') then
    result[i] = -1
  elseif current then
    local score = tonumber(redis.call('ZSCORE', readers, token) or '')
    if score and score <= now then
      result[i] = -2
    elseif score then
      local until_ms = now + lease
      if not exact then
        until_ms = math.max(until_ms, score)
      end
      redis.call('ZADD', readers, 'XX', string.format('%.0f', until_ms), token)
      -- The marker lives as long as the longest reader lease (this one may have shortened).
      local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
      local ttl = math.max(tonumber(last[2]) - now, 1)
      redis.call('SET', key, 'readers', 'PX', ttl)
      redis.call('PEXPIRE', readers, ttl)
      result[i] = 1
    end
  end
end
return result
