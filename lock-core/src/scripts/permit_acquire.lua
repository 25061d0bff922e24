-- Take permits of a semaphore if enough are free and no earlier waiter is in line; else join
-- the line (once: the first arrival keeps its place) and tell the caller how long to wait.
-- guard.lua, clock.lua and line.lua are prepended to this script.
--
-- Layout: one sorted set per semaphore; each holder is one member, `<token>|<holder>:<permits>`, scored
-- by the end of its lease (server clock, ms). Members whose lease ended are dropped by the next
-- call, so a crashed holder's permits come back when its lease ends. The set expires with its
-- longest lease, so an idle semaphore leaves nothing behind.
--
-- The line, as the fair lock's (see fair_acquire.lua): waiting holders scored by arrival
-- (server clock, us), and a second set scoring each by when it stops counting as alive (ms):
-- every try of a waiter renews that, so a waiter that died leaves the line when it expires and
-- does not block the ones behind it (one that gives up or is dropped leaves at once, through
-- its background release, see permit_release.lua). Free permits go to the first in line: the
-- release message names it, so the others need not try. Without the line the waiters of all
-- processes race on every release message and the first to answer wins, which favours some
-- processes over others.
--
-- KEYS[1]  the semaphore's set
-- KEYS[2]  the line (sorted set: holder -> arrival, us)
-- KEYS[3]  the line's liveness (sorted set: holder -> alive until, ms)
-- KEYS[4]  (restart guard only, never in a Cluster) the node's epoch key (see guard.lua)
-- ARGV[1]  the holder: `<token>|<holder>:<permits>` (token >= 128 random bits,
--          hex; the holder name, see holder.rs; permits >= 1)
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the caller stays in line without trying again, in milliseconds (0: the
--          caller will not wait; it takes permits only if nobody is in line)
-- ARGV[4]  the number of permits of the semaphore, as this caller counts them
-- ARGV[5]  the release channel of the semaphore (see permit_release.lua): a channel, not a key
-- ARGV[6]  (with KEYS[4]) the restart guard in milliseconds
--
-- KEYS[2] and KEYS[3] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist, so a migrating Cluster slot refuses the call before it writes anything (see
-- acquire.lua).
--
-- Returns {1, 0} when the holder now has its permits (also when it already had them: a retry
-- is idempotent and re-applies the lease), {0, ms, holder} when too few are free (ms until the
-- first held lease ends, and that holder's stored value, which names it), {0, ms} when another
-- waiter is first in line (ms until it stops counting as alive: a bound for the caller's
-- fallback wake-up), {2, ms} inside the restart guard. A
-- key of another type fails with WRONGTYPE and is never overwritten.
--
-- The count comes with each call, so callers that disagree (a rolling change of the count)
-- each admit up to their own count; lowering it revokes nobody's permits, new holders wait
-- until fewer than the new count are held.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
local wanted = tonumber(string.match(ARGV[1], ':(%d+)$') or '')
local limit = tonumber(ARGV[4])
if not wanted or wanted < 1 or not limit or wanted > limit then
  return redis.error_reply('ERR semaphore permits out of range')
end
if KEYS[4] then
  local young = restart_guard(KEYS[4], ARGV[6])
  if young > 0 then
    return {2, young}
  end
end
local t = redis.call('TIME')
local now = server_ms(t)
local until_ms = string.format('%.0f', now + lease)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
local holders = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local used = 0
for i = 1, #holders, 2 do
  if holders[i] == ARGV[1] then
    -- A retry of our own acquire (its first reply was lost): re-apply the lease.
    redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
    redis.call('PEXPIRE', KEYS[1], lease, 'GT')
    return {1, 0}
  end
  used = used + (tonumber(string.match(holders[i], ':(%d+)$') or '1') or 1)
end
local head = first_in_line(KEYS[2], KEYS[3], now)
if used + wanted <= limit and (not head or head == ARGV[1]) then
  redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
  if #holders == 0 then
    redis.call('PEXPIRE', KEYS[1], lease)
  else
    -- GT: the set lives as long as its longest lease (a set without expiry counts as
    -- infinite, which only the first holder creates, with the PEXPIRE above).
    redis.call('PEXPIRE', KEYS[1], lease, 'GT')
  end
  if head then
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
    -- Permits left for the next in line: tell it now (the message that woke us named us).
    if used + wanted < limit then
      local next_head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
      if next_head then
        redis.pcall('PUBLISH', ARGV[5], next_head)
      end
    end
  end
  return {1, 0}
end
local stay = tonumber(ARGV[3]) or 0
if stay > 0 then
  join_line(KEYS[2], KEYS[3], ARGV[1], t, stay)
  head = head or ARGV[1]
end
if used + wanted > limit then
  return {0, math.max(tonumber(holders[2]) - now, 1), holders[1]}
end
-- Free, but another waiter is first: it has until its liveness ends to take them.
local first = tonumber(redis.call('ZSCORE', KEYS[3], head) or '') or now
return {0, math.max(first - now, 1)}
