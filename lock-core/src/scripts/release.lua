-- Release a mutex if, and only if, it is still held by the caller's token; leave a latch that
-- proves it (with a release retry window); tell the waiters of other lockers, if any marked
-- that they wait (a locker's own waiters queue in its process and need no message). A fair
-- lock's release is fair_release.lua.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the waiting marks of this lock key: the waiting writers (acquirers of other lockers
--          that found it held, see acquire.lua) and the readers' mark (readers of other lockers
--          that found it held by a writer, see read_acquire.lua). Deleted by a release (whoever
--          waits tries again, and marks again if it loses); when the token does not hold the
--          lock it may be an abandoned acquire's, whose entry goes: if it was the last writer
--          waiting and no writer holds the lock, readers that let it go first are told (as
--          withdraw.lua)
-- KEYS[3]  (only with a release retry window) the release latch of this token
--          (`..:unlocked:<token>`, see latch.lua)
-- ARGV[1]  the caller's token
-- ARGV[2]  (only with KEYS[3]) how long the latch lives, in milliseconds: the release retry
--          window (a retry answered after it does not trust a missing latch, see
--          `Node::release`)
--
-- The message on the release channel (release_channel, see channel.lua) is '1': every waiter
-- may try.
--
-- KEYS[2] and KEYS[3] are in the hash slot of KEYS[1] (the kit's hash tag), and declared
-- although they usually do not exist. Inside a script a Redis Cluster checks each command's
-- key on its own: an undeclared key of a migrating slot that is not on this node would fail the
-- script after it deleted the lock key (no latch, no message, an error for a lock it did
-- release). Declared, they are checked before the script runs: while the slot migrates with
-- them split between the nodes (or absent), the call is refused with ASK or TRYAGAIN and
-- nothing was written, so it is sent again (by the cluster client, then by the kit); the latch
-- makes a retry of a call that did run safe.
--
-- Every name and argument sent costs Redis a string on every call, and this is the hot path's
-- release: the latch's name and life are sent only with a window, and the waiting writers and
-- the readers' mark share one key.
--
-- Returns
--   1  deleted now; no other locker marked that it waits
--   2  deleted now; another locker waits (it was told on the channel)
--   3  not held, but the latch says an earlier call with this token deleted it (a retry whose
--      first reply was lost); nobody waited then
--   4  as 3, and another locker waited then
--  -1  the key is absent and no latch: the lock was lost (expired, deleted, or forgotten by a
--      restart) before any release of ours ran, or, with no latch kept, before this try
--   0  the key holds another token, or is of another type, and no latch: lost, left alone
--
-- The latch is how a retried release tells "my first try ran" from "my first try never reached
-- Redis". Without it a retry that finds the key absent or taken cannot know whether this
-- release deleted it or the lock had been lost before: the kit then says the lock was lost,
-- never released (see `Node::release`).
--
-- GET goes through redis.pcall: a key of another type answers an error table, not a string, so
-- it reads as another holder's (0), left alone. PUBLISH does too: an ACL user without channel
-- rights must not turn a release that already deleted the key into an error (scripts are not
-- rolled back). Waiters then fall back to the holder's TTL and the safety-net retry.
local current = redis.pcall('GET', KEYS[1])
local answer
if current == ARGV[1] then
  -- One DEL for the lock and the waiting marks: the lock key exists (it holds our token), so
  -- 2 means another locker marked that it waits.
  answer = redis.call('DEL', KEYS[1], KEYS[2])
  -- The usual release (no latch kept, no other locker waits) ends here, before the shared
  -- functions below are built: Redis builds a script's functions anew on every call (about
  -- 1,600 Redis instructions for these four, 5 % of this release's whole cost in Redis).
  if answer == 1 and not KEYS[3] then
    return 1
  end
end
-- @preambles
if answer then
  leave_latch(KEYS[3], answer, ARGV[2])
  if answer == 2 then
    redis.pcall('PUBLISH', release_channel(KEYS[1]), '1')
  end
  return answer
end
-- Not ours (or not any more): an abandoned acquire's waiting entry goes. Readers that waited
-- for it are told when it was the last writer waiting and none holds the lock; they would
-- otherwise sleep until the set's TTL, the longest waiter's whole wait. `current` is false
-- when the key is absent, a table for another type.
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1
    and not writer_waits(KEYS[2])
    and (not current or current == 'readers') then
  redis.pcall('PUBLISH', release_channel(KEYS[1]), '1')
end
local earlier = latched(KEYS[3])
if earlier then
  return earlier
end
if not current then
  return -1
end
return 0
