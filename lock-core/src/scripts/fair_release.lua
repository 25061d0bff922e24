-- Release a fair lock if, and only if, it is still held by the caller's token: release.lua's
-- steps, and the message names the first waiter in line that is still alive (see line.lua),
-- the only waiter that may take the lock (the others need not try). A call for a fair waiter
-- that gave up (not the holder) takes it out of the line instead of blocking the line until
-- its liveness ends.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiting writers of this lock key (see release.lua)
-- KEYS[3]  the readers' waiting flag of this lock key (see release.lua)
-- KEYS[4]  the line of the lock key, and
-- KEYS[5]  its liveness set (see fair_acquire.lua)
-- KEYS[6]  (only with a release retry window) the release latch of this token (see latch.lua)
-- ARGV[1]  the caller's token
-- ARGV[2]  how long the latch lives, in milliseconds: the release retry window
--
-- KEYS[2] to KEYS[6] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist (see release.lua).
--
-- Returns as release.lua. The message on the release channel (release_channel, see
-- channel.lua) is the first waiter's token, or '1' when only waiting marks say that another
-- locker waits.
local function first_in_fair_line()
  return first_in_line(KEYS[4], KEYS[5], server_ms())
end

local ok, current = pcall(redis.call, 'GET', KEYS[1])
if ok and current == ARGV[1] then
  local waited = math.min(redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) - 1, 1)
  -- The line says who waits, also when the waiting writers are gone: its waiters do not try
  -- (and join them again) after a message that names another.
  local head = first_in_fair_line()
  if head then
    waited = 1
  end
  leave_latch(KEYS[6], waited + 1, ARGV[2])
  if waited == 1 then
    redis.pcall('PUBLISH', release_channel(KEYS[1]), head or '1')
  end
  return waited + 1
end
-- Not ours (or not any more): the waiting entry goes, and readers are told when it was the last
-- (see release.lua); then the line.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 and redis.call('EXISTS', KEYS[2]) == 0
    and ok and (not current or current == 'readers') then
  redis.pcall('PUBLISH', release_channel(KEYS[1]), '1')
end
local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
if head == ARGV[1] then
  -- The first in line gave up: the next one is told (the lock may be free).
  local next_head = first_in_fair_line()
  if next_head then
    redis.pcall('PUBLISH', release_channel(KEYS[1]), next_head)
  end
end
local earlier = latched(KEYS[6])
if earlier then
  return earlier
end
if ok and not current then
  return -1
end
return 0
