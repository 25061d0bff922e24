-- Give back a holder's permits if, and only if, its lease has not ended; leave a latch that
-- proves it; tell the first waiter in line, if any. A call for an acquire that gave up or was
-- dropped (not a holder) takes it out of the line instead. clock.lua, line.lua and latch.lua
-- are prepended to this script.
--
-- KEYS[1]  the semaphore's set (see permit_acquire.lua)
-- KEYS[2]  the line of waiters (sorted set: holder -> arrival, us)
-- KEYS[3]  the line's liveness (sorted set: holder -> alive until, ms)
-- KEYS[4]  (only with a release retry window) the release latch of this holder
-- ARGV[1]  the holder: `<token>|<holder>:<permits>`
-- ARGV[2]  (only with KEYS[4]) how long the latch lives, in milliseconds: the release retry
--          window (see latch.lua)
--
-- The message on the release channel (release_channel, see channel.lua) is the holder name of
-- the first waiter in line, the only one that needs to try (see permit_acquire.lua).
--
-- KEYS[2] to KEYS[4] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist, so a migrating Cluster slot refuses the call before it writes anything (see
-- release.lua).
--
-- Returns, as release.lua: 1 given back now, 2 given back now and another locker waits (it
-- was told), 3 or 4 the latch says an earlier try did that (its reply was lost), -1 the
-- holder's lease had ended (or the set was deleted) before any release of ours ran, 0 the key
-- is of another type.
local ok, score = pcall(redis.call, 'ZSCORE', KEYS[1], ARGV[1])
if not ok then
  return 0
end
local now = server_ms()


score = tonumber(score or '')
if score then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if score > now then
    local head = first_in_line(KEYS[2], KEYS[3], now)
    local waited = head and 1 or 0
    leave_latch(KEYS[4], waited + 1, ARGV[2])
    if head then
      redis.pcall('PUBLISH', release_channel(KEYS[1]), head)
    end
    return waited + 1
  end
end
-- Not a holder: an acquire that gave up or was dropped leaves the line; if it was first, the
-- next one is told (permits may be free that were kept for it).
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('ZREM', KEYS[3], ARGV[1])
  local head = first_in_line(KEYS[2], KEYS[3], now)
  if head then
    redis.pcall('PUBLISH', release_channel(KEYS[1]), head)
  end
end
local earlier = latched(KEYS[4])
if earlier then
  return earlier
end
return -1
