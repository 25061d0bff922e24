-- Take a fair lock: the lock key is free and the caller is first in line (or nobody is in
-- line); else join the line (once: the first arrival keeps its place) and tell the caller how
-- long to wait. guard.lua, clock.lua and line.lua are prepended to this script.
--
-- The lock key is the mutex's (release, renewal and fencing are the mutex's scripts). The line
-- is a sorted set of waiting tokens scored by arrival (server clock, us); a second sorted set
-- scores each waiter by when it stops counting as alive (server clock, ms): every try of a
-- waiter renews that, so a waiter that died or gave up leaves the line when it expires and
-- does not block the ones behind it.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiting writers of the lock key (see acquire.lua): a waiter joins them while in
--          line (so read locks of the key let it go first) and leaves them with the lock; an
--          abandoned waiter leaves them through release.lua
-- KEYS[3]  the line (sorted set: token -> arrival, us)
-- KEYS[4]  the line's liveness (sorted set: token -> alive until, ms)
-- KEYS[5]  (restart guard only, never in a Cluster) the node's epoch key (see guard.lua)
-- ARGV[1]  the caller's token: `<token>|<holder>|fair`, >= 128 random bits in hex, the
--          holder name and the fair mark (see holder.rs); compared whole, like any token
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the caller stays in line without trying again, in milliseconds (0: the
--          caller will not wait; it takes the lock only if nobody is in line)
-- ARGV[4]  (with KEYS[5]) the restart guard in milliseconds
--
-- KEYS[2] to KEYS[4] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist, so a migrating Cluster slot refuses the call before it writes anything (see
-- acquire.lua).
--
-- Returns {1, 0} when the lock is now held by ARGV[1] (also when it already was: a retry is
-- idempotent and re-applies the lease), {0, ms, value} when the caller must wait behind a
-- holder (its remaining lease and its stored value, which names it), {0, ms} while the lock is
-- free but another waiter is first (how long that one stays in line without trying), {2, ms}
-- inside the restart guard. A key of another type fails
-- with WRONGTYPE and is never overwritten.
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
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], lease)
  return {1, 0}
end
local t = redis.call('TIME')
local now_ms = server_ms(t)
local head = first_in_line(KEYS[3], KEYS[4], now_ms)
if not current and (not head or head == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', lease)
  if head then
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {1, 0}
end
local stay = tonumber(ARGV[3]) or 0
if stay > 0 then
  join_line(KEYS[3], KEYS[4], ARGV[1], t, stay)
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
  -- Only ever lengthened, as in acquire.lua: a short wait must not end longer waiters' entries.
  if redis.call('PTTL', KEYS[2]) < stay then
    redis.call('PEXPIRE', KEYS[2], stay)
  end
end
if current then
  return {0, redis.call('PTTL', KEYS[1]), current}
end
-- Free, but another waiter is first: it has until its liveness ends to take it.
local first = tonumber(redis.call('ZSCORE', KEYS[4], head) or '') or now_ms
return {0, math.max(first - now_ms, 1)}
