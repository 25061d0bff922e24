-- Withdraw a waiting writer: an exclusive acquire that joined the waiting writers (see
-- acquire.lua) and stopped waiting (its future was dropped, or its wait ran out) leaves at
-- once, so it no longer holds read locks back. When it was the last writer waiting (the
-- readers' mark, scored -1, is not one, see read_acquire.lua), and no writer holds the lock,
-- the release channel is told: readers that let it go first may try now.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiting marks of the lock key, in its hash slot (declared, see acquire.lua)
-- ARGV[1]  the caller's token
-- ARGV[2]  the release channel of the lock key (a channel, not a key)
--
-- Returns 2 when the caller's entry was there (and is gone) and the channel was told, 1 when
-- the entry was there and nobody needed telling, 0 when it was not there. On RedLock a 2 from
-- any node has the other nodes told too: a waiter listens on one node only, where this
-- writer's entry may be missing or another writer's stale grant may stay.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
if not writer_waits(KEYS[2]) then
  local ok, current = pcall(redis.call, 'GET', KEYS[1])
  if ok and (not current or current == 'readers') then
    redis.pcall('PUBLISH', ARGV[2], '1')
    return 2
  end
end
return 1
