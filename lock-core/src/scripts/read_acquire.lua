-- Take a read (shared) lock: granted while no writer holds the lock and none waits for it.
-- guard.lua and clock.lua are prepended to this script.
--
-- Layout: the lock key is shared with the exclusive lock (a mutex of the same key is its write
-- lock). While readers hold it, the lock key holds the marker "readers" with the longest reader
-- lease as TTL, so a writer's `SET NX` or acquire.lua finds it taken; each reader is a member of
-- the readers set, scored by when its lease ends (server clock, ms), so a crashed reader's hold
-- ends on its own, not with the others'.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiting writers of the lock key (see acquire.lua): exclusive acquirers of other
--          lockers that found the lock taken and wait. One that stops waiting leaves at once
--          (withdraw.lua), one that wins with its grant
-- KEYS[3]  the readers set of the lock key (a sorted set: token -> end of its lease in ms)
-- KEYS[4]  the readers' waiting flag of the lock key: set here when a writer holds the lock, so
--          that the writer's release tells the readers (release.lua deletes it with the waiting
--          writers). A flag of its own: if a writer's hold ends without its release (its lease
--          ran out, a force unlock), a reader's flag must not keep the other readers out
-- KEYS[5]  (restart guard only, never in a Cluster) the node's epoch key (see guard.lua)
-- ARGV[1]  the caller's token: `<token>|<holder>`, >= 128 random bits in hex and the holder
--          name (see holder.rs); compared whole, like any token
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the caller may wait, in milliseconds: the waiting flag lives at least that
--          long (0: the caller will not wait)
-- ARGV[4]  (with KEYS[5]) the restart guard in milliseconds
--
-- KEYS[2] to KEYS[4] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist, so a migrating Cluster slot refuses the call before it writes anything (see
-- acquire.lua).
--
-- Returns {1, 0} when ARGV[1] now holds a read lock (also when it already did: a retry with the
-- same token is idempotent and re-applies the lease), {0, pttl, value} when a writer holds the
-- lock (its remaining lease and its stored value, which names it; the readers' waiting flag is
-- set so the writer's release tells it), or
-- when a writer waits (the waiting writers' remaining life: readers let the
-- writer go first, so a stream of readers cannot starve it), or {2, ms} inside the restart
-- guard. A lock key of another type fails with WRONGTYPE and is never overwritten.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
if KEYS[5] then
  local young = restart_guard(KEYS[5], ARGV[4])
  if young > 0 then
    return {2, young}
  end
end
local current = redis.call('GET', KEYS[1])
local flag = tonumber(ARGV[3]) or 0
if current and current ~= 'readers' then
  -- Only ever lengthened: a reader with a short wait must not end the flag of readers that
  -- wait longer (the writer's release would then tell nobody).
  if flag > 0 and redis.call('PTTL', KEYS[4]) < flag then
    redis.call('SET', KEYS[4], '1', 'PX', flag)
  end
  return {0, redis.call('PTTL', KEYS[1]), current}
end
local now = server_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now))
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  -- A waiting writer goes first. The set is not renewed here: only writers keep it alive, so
  -- an entry of a writer whose process died ends with its TTL.
  local waiting = redis.call('PTTL', KEYS[2])
  if waiting ~= -2 then
    return {0, waiting}
  end
end
redis.call('ZADD', KEYS[3], string.format('%.0f', now + lease), ARGV[1])
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local ttl = math.max(tonumber(last[2]) - now, 1)
redis.call('SET', KEYS[1], 'readers', 'PX', ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {1, 0}
