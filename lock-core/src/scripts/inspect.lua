-- Read who holds a key, for how long, and how many wait, in one call (Locker::inspect). It
-- writes nothing: entries whose lease ended are skipped, not removed. It calls only commands
-- the other scripts call (GET, PTTL, TIME, ZRANGE, ZRANGEBYSCORE), so the documented minimal
-- ACL (acl.md) needs no new right; counts are taken by reading the (small) sets.
--
-- KEYS[1]  the lock key (a holder's stored value `<token>|<holder>[|fair]`, or the marker
--          "readers", see read_acquire.lua)
-- KEYS[2]  the waiting marks of the lock key (see acquire.lua): writers score 0, the readers'
--          mark -1 (see read_acquire.lua) and is not counted (as waiting.lua's writer_waits)
-- KEYS[3]  the readers set of the lock key (token -> end of lease, ms)
-- KEYS[4]  the lock key's line, KEYS[5] its liveness (fair locks, see fair_acquire.lua)
-- KEYS[6]  the semaphore's set of the same user key (`<token>|<holder>:<permits>` -> end of
--          lease, ms; see permit_acquire.lua)
-- KEYS[7]  the semaphore's line, KEYS[8] its liveness
-- ARGV[1]  the most holders' stored values to return (>= 1)
--
-- All keys are in one hash slot (the kit's hash tag) and declared, as every script's keys are
-- (see acquire.lua).
--
-- Returns {0} when neither the lock nor the semaphore is held, else
--   {kind, remaining ms, waiting writers, live waiters in line, count, value, value, ...}
-- kind 1: the lock key holds a holder's value (a mutex, write or fair lock; count 1);
-- kind 2: read locks (count: readers whose lease runs); kind 3: the semaphore (count: permits
-- held). Remaining is the lock key's PTTL (-1: no expiry) or, for a semaphore, until its
-- longest lease ends. Values: the holders' stored values, the lease that ends last first.
-- The lock is looked at first: a lock and a semaphore of one name are separate things, and
-- the lock is reported when both are held. A key of another type fails with WRONGTYPE.
local most = tonumber(ARGV[1]) or 1
local now = server_ms()
local after_now = '(' .. string.format('%.0f', now)

-- The members of a sorted set whose score (an end of lease, an end of liveness) is after now,
-- in ascending order of score, with their scores.
local function live(set)
  return redis.call('ZRANGEBYSCORE', set, after_now, '+inf', 'WITHSCORES')
end

-- Appends the members of `entries` (member, score pairs in ascending order of score) to
-- `reply`, the last first, at most `most` of them.
local function last_first(reply, entries)
  local i = #entries - 1
  while i >= 1 and #reply < 5 + most do
    reply[#reply + 1] = entries[i]
    i = i - 2
  end
  return reply
end

local current = redis.call('GET', KEYS[1])
if current then
  local pttl = redis.call('PTTL', KEYS[1])
  local writers = #redis.call('ZRANGEBYSCORE', KEYS[2], 0, '+inf')
  if current ~= 'readers' then
    return {1, pttl, writers, #live(KEYS[5]) / 2, 1, current}
  end
  local readers = live(KEYS[3])
  return last_first({2, pttl, writers, 0, #readers / 2}, readers)
end
local holders = live(KEYS[6])
if #holders == 0 then
  return {0}
end
local permits = 0
for i = 1, #holders, 2 do
  permits = permits + (tonumber(string.match(holders[i], ':(%d+)$') or '1') or 1)
end
local remaining = math.max(tonumber(holders[#holders]) - now, 1)
return last_first({3, remaining, 0, #live(KEYS[8]) / 2, permits}, holders)
