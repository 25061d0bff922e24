-- Release a fair lock if, and only if, it is still held by the caller's token: release.lua's
-- steps, and the message names the first waiter in line that is still alive (see line.lua),
-- the only waiter that may take the lock (the others need not try). A call for a fair waiter
-- that gave up (not the holder) takes it out of the line instead of blocking the line until
-- its liveness ends.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiting marks of this lock key: writers and the readers' mark (see release.lua)
-- KEYS[3]  the line of the lock key, and
-- KEYS[4]  its liveness set (see fair_acquire.lua)
-- KEYS[5]  (only with a release retry window) the release latch of this token (see latch.lua)
-- ARGV[1]  the caller's token
-- ARGV[2]  (only with KEYS[5]) how long the latch lives, in milliseconds: the release retry
--          window
--
-- KEYS[2] to KEYS[5] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist (see release.lua).
--
-- Returns as release.lua. The message on the release channel (release_channel, see
-- channel.lua) is the first waiter's token, or '1' when only waiting marks say that another
-- locker waits.
local function first_in_fair_line()
  return first_in_line(KEYS[3], KEYS[4], server_ms())
end

local current = redis.pcall('GET', KEYS[1])
if current == ARGV[1] then
  local answer = redis.call('DEL', KEYS[1], KEYS[2])
  -- The line says who waits, also when the waiting marks are gone: its waiters do not try
  -- (and join them again) after a message that names another.
  local head = first_in_fair_line()
  if head then
    answer = 2
  end
  leave_latch(KEYS[5], answer, ARGV[2])
  if answer == 2 then
    redis.pcall('PUBLISH', release_channel(KEYS[1]), head or '1')
  end
  return answer
end
-- Not ours (or not any more): the waiting entry goes, and readers are told when it was the last
-- (see release.lua); then the line.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1
    and not writer_waits(KEYS[2])
    and (not current or current == 'readers') then
  redis.pcall('PUBLISH', release_channel(KEYS[1]), '1')
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if head == ARGV[1] then
  -- The first in line gave up: the next one is told (the lock may be free).
  local next_head = first_in_fair_line()
  if next_head then
    redis.pcall('PUBLISH', release_channel(KEYS[1]), next_head)
  end
end
local earlier = latched(KEYS[5])
if earlier then
  return earlier
end
if not current then
  return -1
end
return 0
