-- Release the lock if, and only if, it is still held by the caller's token, and tell waiters.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the caller's token
-- ARGV[2]  the release channel of this lock key
--
-- Returns -1 when the key is absent, 0 when it holds another token or is of another type (never
-- ours, left alone), 1 when the key was deleted and nobody listened on the channel, 2 when it
-- was deleted and waiters (in other processes) were told. Absent and foreign are told apart so
-- that a retried release whose first reply was lost can tell "already deleted by us" from
-- "taken over".
--
-- PUBLISH goes through redis.pcall: an ACL user without channel rights must not turn a release
-- that already deleted the key into an error (scripts are not rolled back). Waiters then fall
-- back to the holder's TTL and the safety-net retry.
local ok, current = pcall(redis.call, 'GET', KEYS[1])
if ok and not current then
  return -1
end
if ok and current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local told = redis.pcall('PUBLISH', ARGV[2], '1')
  if type(told) == 'number' and told > 0 then
    return 2
  end
  return 1
end
return 0
