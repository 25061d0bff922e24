-- Take permits of a semaphore if enough are free; else tell the caller when the first held
-- permit's lease ends, and flag that it waits. guard.lua is prepended to this script.
--
-- Layout: one sorted set per semaphore; each holder is one member, `<token>:<permits>`, scored
-- by the end of its lease (server clock, ms). Members whose lease ended are dropped by the next
-- call, so a crashed holder's permits come back when its lease ends. The set expires with its
-- longest lease, so an idle semaphore leaves nothing behind.
--
-- KEYS[1]  the semaphore's set
-- ARGV[1]  the holder: `<token>:<permits>` (token >= 128 random bits, hex; permits >= 1)
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the waiting flag lives, in milliseconds (0: the caller will not wait)
-- ARGV[4]  the waiting flag of the semaphore, a key name in the hash slot of KEYS[1], not
--          declared (see acquire.lua)
-- ARGV[5]  the number of permits of the semaphore, as this caller counts them
-- KEYS[2]  (restart guard only, never in a Cluster) the node's epoch key (see guard.lua)
-- ARGV[6]  (with KEYS[2]) the restart guard in milliseconds
--
-- Returns {1, 0} when the holder now has its permits (also when it already had them: a retry
-- is idempotent and re-applies the lease), {0, ms} when too few are free (ms until the first
-- held lease ends, a bound for the caller's fallback wake-up), {2, ms} inside the restart
-- guard. A key of another type fails with WRONGTYPE and is never overwritten.
--
-- The count comes with each call, so callers that disagree (a rolling change of the count)
-- each admit up to their own count; lowering it revokes nobody's permits, new holders wait
-- until fewer than the new count are held.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
local wanted = tonumber(string.match(ARGV[1], ':(%d+)$') or '')
local limit = tonumber(ARGV[5])
if not wanted or wanted < 1 or not limit or wanted > limit then
  return redis.error_reply('ERR semaphore permits out of range')
end
if KEYS[2] then
  local young = restart_guard(KEYS[2], ARGV[6])
  if young > 0 then
    return {2, young}
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
if used + wanted > limit then
  local flag = tonumber(ARGV[3]) or 0
  if flag > 0 then
    redis.call('SET', ARGV[4], '1', 'PX', flag)
  end
  return {0, math.max(tonumber(holders[2]) - now, 1)}
end
redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
if #holders == 0 then
  redis.call('PEXPIRE', KEYS[1], lease)
else
  -- GT: the set lives as long as its longest lease (a set without expiry counts as infinite,
  -- which only the first holder creates, with the PEXPIRE above).
  redis.call('PEXPIRE', KEYS[1], lease, 'GT')
end
return {1, 0}
