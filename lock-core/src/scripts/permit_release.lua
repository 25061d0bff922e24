-- Give back a holder's permits if, and only if, its lease has not ended; leave a latch that
-- proves it; tell the first waiter in line, if any. A call for an acquire that gave up or was
-- dropped (not a holder) takes it out of the line instead. clock.lua, line.lua and latch.lua
-- are prepended to this script.
--
-- KEYS[1]  the semaphore's set (see permit_acquire.lua)
-- KEYS[2]  the release latch of this holder
-- KEYS[3]  the line of waiters (sorted set: holder -> arrival, us)
-- KEYS[4]  the line's liveness (sorted set: holder -> alive until, ms)
-- ARGV[1]  the holder: `<token>|<holder>:<permits>`
-- ARGV[2]  the release channel of the semaphore (a channel, not a key); the message is the
--          holder name of the first waiter in line, the only one that needs to try (see
--          permit_acquire.lua)
-- ARGV[3]  how long the latch lives, in milliseconds: the release retry window (a retry answered
--          after it does not trust a missing latch, see `Node::release`)
--          or 0: no latch (a retry that finds the key gone cannot tell, and says so)
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
    local head = first_in_line(KEYS[3], KEYS[4], now)
    local waited = head and 1 or 0
    leave_latch(KEYS[2], waited + 1, ARGV[3])
    if head then
      redis.pcall('PUBLISH', ARGV[2], head)
    end
    return waited + 1
  end
end
-- Not a holder: an acquire that gave up or was dropped leaves the line; if it was first, the
-- next one is told (permits may be free that were kept for it).
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
  redis.call('ZREM', KEYS[4], ARGV[1])
  local head = first_in_line(KEYS[3], KEYS[4], now)
  if head then
    redis.pcall('PUBLISH', ARGV[2], head)
  end
end
local earlier = latched(KEYS[2])
if earlier then
  return earlier
end
return -1
