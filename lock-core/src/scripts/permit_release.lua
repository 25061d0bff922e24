-- Give back a holder's permits if, and only if, its lease has not ended; leave a latch that
-- proves it; tell the waiters of other lockers, if any flagged that they wait (the flag names
-- the waiter whose turn it is, if any: see permit_acquire.lua).
--
-- KEYS[1]  the semaphore's set (see permit_acquire.lua)
-- ARGV[1]  the holder: `<token>:<permits>`
-- ARGV[2]  the release channel of the semaphore; the message is the holder name of the
--          waiter whose turn it is (see permit_acquire.lua), or '1' for every waiter
-- ARGV[3]  how long the latch lives, in milliseconds (longer than any retry of this release)
-- ARGV[4]  the release latch of this holder
-- ARGV[5]  the waiting flag of the semaphore
--
-- ARGV[4] and ARGV[5] are key names in the hash slot of KEYS[1], not declared (see
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
score = tonumber(score or '')
if score then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREM', KEYS[1], ARGV[1])
  if score > now then
    -- The flag goes (the waiters told now set it again if they still wait), except a next
    -- waiter's turn, which stays until it takes its permits or the turn lapses (see
    -- permit_acquire.lua).
    local flag = redis.call('GET', ARGV[5])
    local waited = 0
    local message = '1'
    if flag then
      waited = 1
      local who, till = string.match(flag, '^(.*)@(%d+)$')
      if who and tonumber(till) > now then
        -- The message names the next waiter: the others need not try.
        message = who
      else
        redis.call('DEL', ARGV[5])
      end
    end
    redis.call('SET', ARGV[4], tostring(waited + 1), 'PX', ARGV[3])
    if waited == 1 then
      redis.pcall('PUBLISH', ARGV[2], message)
    end
    return waited + 1
  end
end
-- Not a holder: an acquire that gave up or was dropped. If it was next, the turn passes on
-- now, and the other waiters are told (permits may be free that were kept for it).
local flag = redis.call('GET', ARGV[5])
if flag and string.sub(flag, 1, #ARGV[1] + 1) == ARGV[1] .. '@' then
  redis.call('SET', ARGV[5], '1', 'KEEPTTL')
  redis.pcall('PUBLISH', ARGV[2], '1')
end
local latch = redis.call('GET', ARGV[4])
if latch then
  return tonumber(latch) + 2
end
return -1
