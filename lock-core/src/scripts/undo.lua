-- Undo a RedLock node's grant to a try that did not win a majority: delete the lock key if,
-- and only if, it holds the try's token. Nothing else: the acquire may go on waiting, so its
-- entry in the waiting writers (under its first try's token, see acquire.lua) stays, and
-- readers keep letting it go first and the holder's release keeps telling it. (release.lua
-- would take the entry out: to a release, a token that does not hold the lock is an abandoned
-- acquire's.) No latch and no message: nobody held the lock.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the try's token
--
-- Returns 1 when the key held the token and is deleted, 0 otherwise (absent, another token,
-- or a key of another type, which is left alone).
local ok, current = pcall(redis.call, 'GET', KEYS[1])
if ok and current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
