-- Take a read (shared) lock: granted while no writer holds the lock and none waits for it.
-- guard.lua, clock.lua and waiting.lua are prepended to this script.
--
-- Layout: the lock key is shared with the exclusive lock (a mutex of the same key is its write
-- lock). While readers hold it, the lock key holds the marker "readers" with the longest reader
-- lease as TTL, so a writer's `SET NX` or acquire.lua finds it taken; each reader is a member of
-- the readers set, scored by when its lease ends (server clock, ms), so a crashed reader's hold
-- ends on its own, not with the others'.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiting marks of the lock key (see acquire.lua): the waiting writers, exclusive
--          acquirers of other lockers that found the lock taken and wait, each scored 0 (one
--          that stops waiting leaves at once, withdraw.lua; one that wins with its grant), and
--          the readers' mark, the member `readers` scored -1: added here when a writer holds
--          the lock, so that the writer's release tells the readers (release.lua deletes the
--          set). Only scores from 0 up count as a writer that waits: if a writer's hold ends
--          without its release (its lease ran out, a force unlock), the readers' mark must not
--          keep the other readers out. The mark shares the writers' key so that the hot path's
--          release sends one name for both (a member, never a token: tokens hold a `|`)
-- KEYS[3]  the readers set of the lock key (a sorted set: token -> end of its lease in ms)
-- KEYS[4]  (restart guard only, never in a Cluster) the node's epoch key (see guard.lua)
-- ARGV[1]  the caller's token: `<token>|<holder>`, >= 128 random bits in hex and the holder
--          name (see holder.rs); compared whole, like any token
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the caller may wait, in milliseconds: the readers' mark lives at least that
--          long (0: the caller will not wait)
-- ARGV[4]  (with KEYS[4]) the restart guard in milliseconds
--
-- KEYS[2] and KEYS[3] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist, so a migrating Cluster slot refuses the call before it writes anything (see
-- acquire.lua).
--
-- Returns {1, 0} when ARGV[1] now holds a read lock (also when it already did: a retry with the
-- same token is idempotent and re-applies the lease), {0, pttl, value} when a writer holds the
-- lock (its remaining lease and its stored value, which names it; the readers' mark is
-- set so the writer's release tells it), or
-- when a writer waits (the waiting writers' remaining life: readers let the
-- writer go first, so a stream of readers cannot starve it), or {2, ms} inside the restart
-- guard. A lock key of another type fails with WRONGTYPE and is never overwritten.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
if KEYS[4] then
  local young = restart_guard(KEYS[4], ARGV[4])
  if young > 0 then
    return {2, young}
  end
end
local current = redis.call('GET', KEYS[1])
local flag = tonumber(ARGV[3]) or 0
if current and current ~= 'readers' then
  if flag > 0 then
    redis.call('ZADD', KEYS[2], -1, 'readers')
    -- Only ever lengthened: a reader with a short wait must not end the mark of readers that
    -- wait longer (the writer's release would then tell nobody), nor the entries of writers.
    if redis.call('PTTL', KEYS[2]) < flag then
      redis.call('PEXPIRE', KEYS[2], flag)
    end
  end
  return {0, redis.call('PTTL', KEYS[1]), current}
end
local now = server_ms()
if not current then
  -- No marker: every entry left in the readers' set lost its hold (the marker lives as long
  -- as the longest entry), whoever held the lock since. Written over, they would hold again.
  -- (By score: the documented ACL allows ZREMRANGEBYSCORE.)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '+inf')
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now))
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  -- A waiting writer goes first. The set is not renewed here: only waiters keep it alive, so
  -- an entry of a writer whose process died ends with its TTL.
  if writer_waits(KEYS[2]) then
    return {0, redis.call('PTTL', KEYS[2])}
  end
end
redis.call('ZADD', KEYS[3], string.format('%.0f', now + lease), ARGV[1])
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local ttl = math.max(tonumber(last[2]) - now, 1)
redis.call('SET', KEYS[1], 'readers', 'PX', ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {1, 0}
