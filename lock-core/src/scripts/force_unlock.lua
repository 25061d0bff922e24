-- Delete a lock whoever holds it (an operator's tool), and tell waiters.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the release channel of this lock key
--
-- Returns 1 when a lock was deleted, 0 when there was none. A key of another type is left alone
-- and reported as a WRONGTYPE error.
if redis.call('TYPE', KEYS[1])['ok'] == 'none' then
  return 0
end
redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[1], '1')
return 1
