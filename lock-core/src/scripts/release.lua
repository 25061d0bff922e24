-- Release the lock if, and only if, it is still held by the caller's token, and tell waiters.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the caller's token
-- ARGV[2]  the release channel of this lock key
--
-- Returns 0 when the key is absent or holds another token (the caller had lost the lock; a key
-- of another type is never ours and is left alone), 1 when the key was deleted and nobody
-- listened on the channel, 2 when it was deleted and waiters (in other processes) were told.
--
-- PUBLISH goes through redis.pcall: an ACL user without channel rights must not turn a release
-- that already deleted the key into an error (scripts are not rolled back). Waiters then fall
-- back to the holder's TTL and the safety-net retry.
local ok, current = pcall(redis.call, 'GET', KEYS[1])
if ok and current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local told = redis.pcall('PUBLISH', ARGV[2], '1')
  if type(told) == 'number' and told > 0 then
    return 2
  end
  return 1
end
return 0
