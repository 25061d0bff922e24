-- Take the lock if it is free; else tell the caller how long it stays taken, and flag that the
-- caller waits for it (the caller joins the waiting writers). The first try of an acquire is a
-- plain `SET NX PX` instead when no restart guard is set; this script serves the tries after
-- it (and every try with the guard).
-- Fencing tokens are issued on demand by fence.lua.
--
-- KEYS[1]  the lock key (a string holding the owner's token; while readers hold the lock, the
--          marker "readers" with the longest reader lease as TTL, see read_acquire.lua: to a
--          writer it is held like by any other token)
-- KEYS[2]  the waiting writers of this lock key, in its hash slot: a sorted set of the entries
--          of exclusive acquirers (of other lockers) that found the lock held and wait for it,
--          living as long as the one that may wait longest. It tells the holder's release
--          that another locker waits (the holder's own process then holds back its next local
--          acquirer for a moment), and read locks let a writer in it go first (see
--          read_acquire.lua). The caller joins it here; a try that wins leaves it, and an
--          acquire that stops waiting leaves it through withdraw.lua (one whose process died
--          stays until the set's TTL ends). Writers score 0; the set also holds the readers'
--          mark, scored -1, when readers of other lockers wait (see read_acquire.lua)
-- KEYS[3]  (restart guard only, never in a Cluster) the node's epoch key (see guard.lua,
--          which is prepended to this script)
-- ARGV[1]  the caller's token: `<token>|<holder>`, >= 128 random bits in hex and the holder
--          name (see holder.rs); compared whole, like any token
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the caller may wait, in milliseconds: its entry in the waiting writers
--          lives that long (0: the caller will not wait and does not join)
-- ARGV[4]  the caller's entry in the waiting writers: the token of its acquire's first try.
--          The same as ARGV[1] on one Redis; on RedLock each try has a fresh token (the undo of
--          a failed try, see undo.lua, must not hit the next one), and one entry for the whole
--          wait lets a win or a withdrawal take it out, and nothing of earlier tries stays
-- ARGV[5]  (with KEYS[3]) the restart guard in milliseconds
--
-- Every key the script touches is declared, although the waiting writers usually do not
-- exist: a Redis Cluster checks each command of a script on its own, and a key of a migrating
-- slot that is not on this node fails that command after the script's earlier writes. Declared,
-- the keys are checked before the script runs: while the slot migrates with them split between
-- the nodes (or absent), the call is refused with ASK or TRYAGAIN, which is retried, and
-- nothing was written.
--
-- Returns {1, 0} when the lock is now held by ARGV[1] (also when it already was: a retried
-- acquire with the same token is idempotent, and re-applies the lease), or {0, pttl, value}
-- when another token holds it (pttl = -1 when the holder's key has no expiry; value: what the
-- lock key holds, the holder's token with its holder name, or the readers' marker, read anyway
-- by the comparison below, so naming the holder costs nothing), or {2, ms} when the
-- node's data set is younger than the guard: a node that lost its data (a restart without
-- persistence or from an older snapshot, a flush) may have forgotten locks it granted, so it
-- grants nothing until they have surely expired.
--
-- A key of another type makes GET fail with WRONGTYPE: the error reaches the caller, and the key
-- is never overwritten.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
if KEYS[3] then
  local young = restart_guard(KEYS[3], ARGV[5])
  if young > 0 then
    return {2, young}
  end
end
-- GET first: this script mostly serves tries that find the lock taken (an acquire's first
-- try is a plain SET NX), and GET answers those in one command where SET NX then GET took two.
local current = redis.call('GET', KEYS[1])
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', lease)
  -- The winner waits no more: it must not hold readers back, nor tell a later release that
  -- someone waits (the set goes with its last member).
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {1, 0}
end
if current == ARGV[1] then
  -- A retry of our own acquire (its first reply was lost). Re-applying the lease is a write on
  -- this connection, so a WAIT that follows counts replicas of it (and of everything before
  -- it, the first grant included), not of nothing.
  redis.call('PEXPIRE', KEYS[1], lease)
  return {1, 0}
end
local flag = tonumber(ARGV[3]) or 0
if flag > 0 then
  -- Scores do not matter: the set's TTL bounds every entry. A dead writer's entry thus stays
  -- until the longest waiter that joined could have waited (at most 3 fallback retries).
  redis.call('ZADD', KEYS[2], 0, ARGV[4])
  -- Only ever lengthened: a writer with a short wait must not end the entries of writers that
  -- wait longer (readers would stop letting them go first).
  if redis.call('PTTL', KEYS[2]) < flag then
    redis.call('PEXPIRE', KEYS[2], flag)
  end
end
return {0, redis.call('PTTL', KEYS[1]), current}
