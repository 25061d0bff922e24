-- Release the lock if, and only if, it is still held by the caller's token, and tell waiters.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the caller's token
-- ARGV[2]  the release channel of this lock key
--
-- Returns 1 when the key was deleted, 0 when it is absent or holds another token (the caller had
-- lost the lock). A key of another type is never ours: 0, and the key is left alone.
--
-- PUBLISH goes through redis.pcall: an ACL user without channel rights must not turn a release
-- that already deleted the key into an error (scripts are not rolled back). Waiters then fall
-- back to the holder's TTL and the safety-net retry.
local ok, current = pcall(redis.call, 'GET', KEYS[1])
if ok and current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
