-- Take the lock if it is free and issue a fencing token, in one atomic step.
--
-- KEYS[1]  the lock key (a string holding the owner's token)
-- KEYS[2]  the fence key (the last fencing token issued for this lock key)
-- ARGV[1]  the caller's token (>= 128 random bits, hex)
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the fence key outlives the last acquire, in milliseconds (>= ARGV[2])
--
-- Returns {1, fence} when the lock is now held by ARGV[1] (also when it already was: a retried
-- acquire with the same token is idempotent), or {0, pttl} when another token holds it
-- (pttl = -1 when the holder's key has no expiry).
--
-- A key of another type makes GET fail with WRONGTYPE: the error reaches the caller, and the key
-- is never overwritten.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', lease) then
  -- Fencing token: the server's clock in microseconds, or last + 1 when that is not larger, so
  -- tokens strictly increase while the fence key lives, stay increasing after it expired as
  -- long as the server clock did not step back by more than the retention, and keep growing
  -- with the clock after a failover that lost the last counter writes. SET .. GET writes the
  -- common case and reads the previous token in one command.
  local now = redis.call('TIME')
  local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3], 'GET') or '0') or 0
  if fence <= last then
    fence = last + 1
    redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  end
  return {1, fence}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0') or 0}
end
return {0, redis.call('PTTL', KEYS[1])}
