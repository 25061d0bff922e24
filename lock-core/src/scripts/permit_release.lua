-- Give back a holder's permits if, and only if, its lease has not ended; leave a latch that
-- proves it; tell the waiters of other lockers, if any flagged that they wait.
--
-- KEYS[1]  the semaphore's set (see permit_acquire.lua)
-- ARGV[1]  the holder: `<token>:<permits>`
-- ARGV[2]  the release channel of the semaphore
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
    local waited = redis.call('DEL', ARGV[5])
    redis.call('SET', ARGV[4], tostring(waited + 1), 'PX', ARGV[3])
    if waited == 1 then
      redis.pcall('PUBLISH', ARGV[2], '1')
    end
    return waited + 1
  end
end
local latch = redis.call('GET', ARGV[4])
if latch then
  return tonumber(latch) + 2
end
return -1
