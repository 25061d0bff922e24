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
-- ARGV[2]  the number of permits of the semaphore, as this caller counts them (see
--          permit_acquire.lua): whether a waiter that leaves the line leaves enough free for
--          the next
-- ARGV[3]  (only with KEYS[4]) how long the latch lives, in milliseconds: the release retry
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
    leave_latch(KEYS[4], waited + 1, ARGV[3])
    if head then
      redis.pcall('PUBLISH', release_channel(KEYS[1]), head)
    end
    return waited + 1
  end
end
-- Not a holder: an acquire that gave up, was dropped, or took a permit handed over in its own
-- process leaves the line. Only the first in line had free permits kept for it: when it
-- leaves, the next in line is told if they are enough for it. A waiter further back changes
-- nothing for anyone, nor does one that leaves too few free (the next release tells the next
-- in line): telling it then only had it try in vain, a message and a failed try for every
-- permit handed over in a process while other processes wait. A caller that counts fewer
-- permits than the next in line (a rolling change of the count) may leave it to its
-- fallback retry.
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local first = first_in_line(KEYS[2], KEYS[3], now)
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  local head = first == ARGV[1] and redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    -- Written out, not a function: this script is also the hot path's release, and a
    -- function is built on every call. Leases that ended count as free.
    local used = 0
    local alive = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.0f', now), '+inf')
    for _, holder in ipairs(alive) do
      used = used + (tonumber(string.match(holder, ':(%d+)$') or '1') or 1)
    end
    local wanted = tonumber(string.match(head, ':(%d+)$') or '1') or 1
    local limit = tonumber(ARGV[2])
    if not limit or used + wanted <= limit then
      redis.pcall('PUBLISH', release_channel(KEYS[1]), head)
    end
  end
end
local earlier = latched(KEYS[4])
if earlier then
  return earlier
end
return -1
