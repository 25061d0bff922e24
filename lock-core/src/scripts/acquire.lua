-- Take the lock if it is free and issue a fencing token, in one atomic step.
--
-- KEYS[1]  the lock key (a string holding the owner's token)
-- KEYS[2]  the fence key (the last fencing token issued for this lock key)
-- ARGV[1]  the caller's token (>= 128 random bits, hex)
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the fence key outlives the last acquire, in milliseconds (>= ARGV[2])
-- KEYS[3]  (RedLock restart guard only) the node's epoch key: when, by this server's clock in
--          microseconds, the node first served an acquire with its current data set
-- ARGV[4]  (with KEYS[3]) the restart guard in milliseconds
--
-- Returns {1, fence} when the lock is now held by ARGV[1] (also when it already was: a retried
-- acquire with the same token is idempotent), or {0, pttl} when another token holds it
-- (pttl = -1 when the holder's key has no expiry), or {2, ms} when the node's epoch is younger
-- than the guard: a node that lost its data (restart without persistence, flush) may have
-- forgotten locks it granted, so it grants nothing until they have surely expired.
--
-- A key of another type makes GET fail with WRONGTYPE: the error reaches the caller, and the key
-- is never overwritten.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
if KEYS[3] then
  local guard = tonumber(ARGV[4]) or 0
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local epoch = tonumber(redis.call('GET', KEYS[3]) or '')
  -- A missing epoch means a data set the kit has not seen (a new or wiped node); one in the
  -- future means the clock stepped back: both start the guard now.
  if not epoch or epoch > now then
    redis.call('SET', KEYS[3], string.format('%.0f', now))
    epoch = now
  end
  local young = guard - math.floor((now - epoch) / 1000)
  if young > 0 then
    return {2, young}
  end
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
