-- Delete a lock whoever holds it (an operator's tool), and tell waiters.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the readers set of this lock key (see read_acquire.lua), in its hash slot (declared,
--          so a migrating Cluster slot refuses the call before it deletes anything, see
--          acquire.lua)
-- ARGV[1]  the release channel of this lock key (a channel, not a key)
--
-- Returns 1 when a lock (a writer's, or every reader's) was deleted, 0 when there was none. A
-- key of another type is left alone and reported as a WRONGTYPE error.
if redis.call('TYPE', KEYS[1])['ok'] == 'none' then
  return 0
end
redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
redis.pcall('PUBLISH', ARGV[1], '1')
return 1
