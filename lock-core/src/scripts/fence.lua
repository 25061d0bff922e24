-- Issue the next fencing token of a lock to its holder, only while it holds the lock.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fence key (the last fencing token issued for this lock key)
-- ARGV[1]  the holder's token
-- ARGV[2]  how long the fence key outlives this issue, in milliseconds (>= 1)
--
-- Returns the token (> 0), or -1 when the lock is not held by ARGV[1] (expired, deleted, taken
-- over, or a key of another type): a holder that lost its lock gets no token.
--
-- The token is the server's clock in microseconds, or last + 1 when that is not larger, so
-- tokens strictly increase in the order of the holders (each gets its token while it holds, so
-- after every earlier holder got theirs) while the fence key lives, stay increasing after it
-- expired as long as the server clock did not step back by more than the retention, and keep
-- growing with the clock after a failover that lost the last counter writes. SET .. GET writes
-- the common case and reads the previous token in one command.
local ok, current = pcall(redis.call, 'GET', KEYS[1])
if not ok or current ~= ARGV[1] then
  return -1
end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[2], 'GET') or '0') or 0
if fence <= last then
  fence = last + 1
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[2])
end
return fence
