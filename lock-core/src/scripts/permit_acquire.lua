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
-- ARGV[6]  the release channel of the semaphore (see permit_release.lua)
-- KEYS[2]  (restart guard only, never in a Cluster) the node's epoch key (see guard.lua)
-- ARGV[7]  (with KEYS[2]) the restart guard in milliseconds
--
-- Returns {1, 0} when the holder now has its permits (also when it already had them: a retry
-- is idempotent and re-applies the lease), {0, ms} when too few are free or another waiter is
-- next (ms until the first held lease ends, or until the next waiter's turn lapses: a bound
-- for the caller's fallback wake-up), {2, ms} inside the restart guard. A key of another type fails with WRONGTYPE and is never overwritten.
--
-- Turns: the waiting flag (ARGV[4]) is '1' (someone waits) or `<holder>@<ms>`: that waiter
-- is next until the server clock reaches ms. The first waiter to find too few permits while
-- nobody is next becomes next, for half its flag's life (1.5 fallback retries by default;
-- each of its tries renews it, and it tries at least once per fallback retry), and while it
-- is, free permits are for it alone; taking them makes the flag '1' again. Without turns the
-- waiters of all processes race on every release message and the first to answer wins, which
-- favours some processes over others; with them a waiter that lost a race gets the next
-- permit. A next waiter that gives up or is dropped hands its turn on at once (its background
-- release, see permit_release.lua); one whose process died holds free permits back until
-- its turn ends.
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
  local young = restart_guard(KEYS[2], ARGV[7])
  if young > 0 then
    return {2, young}
  end
end
local flag_ms = tonumber(ARGV[3]) or 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = string.format('%.0f', now + lease)
local flag = redis.call('GET', ARGV[4])
local next_holder, next_until = nil, 0
if flag then
  local who, till = string.match(flag, '^(.*)@(%d+)$')
  if who and tonumber(till) > now then
    next_holder, next_until = who, tonumber(till)
  end
end
-- Our permits are taken (or were already ours; `free` permits are left): if we were next,
-- the others' turn comes, and if permits are left they are told now (the release message
-- that woke us named us, so they did not try).
local function taken(free)
  if next_holder == ARGV[1] then
    redis.call('SET', ARGV[4], '1', 'KEEPTTL')
    if free > 0 then
      redis.pcall('PUBLISH', ARGV[6], '1')
    end
  end
  return {1, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
local holders = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local used = 0
for i = 1, #holders, 2 do
  if holders[i] == ARGV[1] then
    -- A retry of our own acquire (its first reply was lost): re-apply the lease.
    redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
    redis.call('PEXPIRE', KEYS[1], lease, 'GT')
    return taken(0)
  end
  used = used + (tonumber(string.match(holders[i], ':(%d+)$') or '1') or 1)
end
if used + wanted > limit or (next_holder and next_holder ~= ARGV[1]) then
  if flag_ms > 0 then
    if not next_holder or next_holder == ARGV[1] then
      -- Nobody else is next: we are, and the flag lives at least as long as our wait.
      local pttl = redis.call('PTTL', ARGV[4])
      local turn_ms = math.max(math.floor(flag_ms / 2), 1)
      redis.call('SET', ARGV[4], ARGV[1] .. '@' .. string.format('%.0f', now + turn_ms),
        'PX', math.max(flag_ms, pttl))
    else
      redis.call('PEXPIRE', ARGV[4], flag_ms, 'GT')
    end
  end
  local first_end = tonumber(holders[2])
  if not first_end or used + wanted <= limit then
    -- Permits are free but another waiter is next: until its turn ends at the latest.
    return {0, math.max(next_until - now, 1)}
  end
  return {0, math.max(first_end - now, 1)}
end
redis.call('ZADD', KEYS[1], until_ms, ARGV[1])
if #holders == 0 then
  redis.call('PEXPIRE', KEYS[1], lease)
else
  -- GT: the set lives as long as its longest lease (a set without expiry counts as infinite,
  -- which only the first holder creates, with the PEXPIRE above).
  redis.call('PEXPIRE', KEYS[1], lease, 'GT')
end
return taken(limit - used - wanted)
