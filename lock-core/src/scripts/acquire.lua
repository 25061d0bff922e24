-- Take the lock if it is free; else tell the caller how long it stays taken, and flag that the
-- caller waits for it. The first try of an acquire is a plain `SET NX PX` instead when no
-- restart guard is set; this script serves the tries after it (and every try with the guard).
-- Fencing tokens are issued on demand by fence.lua.
--
-- KEYS[1]  the lock key (a string holding the owner's token)
-- ARGV[1]  the caller's token (>= 128 random bits, hex)
-- ARGV[2]  the lease in milliseconds (>= 1)
-- ARGV[3]  how long the waiting flag lives, in milliseconds (0: the caller will not wait)
-- ARGV[4]  the waiting flag of this lock key, a key name in the hash slot of KEYS[1]: set when
--          the caller finds the lock held and will wait for it, so that the holder's release
--          knows that another locker waits (the holder's own process then holds back its next
--          local acquirer for a moment). Not declared as a key: it usually does not exist, and
--          while a Cluster slot migrates a command whose declared keys exist only in part is
--          refused with TRYAGAIN.
-- KEYS[2]  (restart guard only, never in a Cluster) the node's epoch key:
--          "<run_id>:<epoch>", where epoch is when, by this server's clock in microseconds,
--          its current data set began
-- ARGV[5]  (with KEYS[2]) the restart guard in milliseconds
--
-- Returns {1, 0} when the lock is now held by ARGV[1] (also when it already was: a retried
-- acquire with the same token is idempotent, and re-applies the lease), or {0, pttl} when
-- another token holds it (pttl = -1 when the holder's key has no expiry), or {2, ms} when the
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
if KEYS[2] then
  local guard = tonumber(ARGV[5]) or 0
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  -- run_id changes at every start of the server, whatever it loaded (nothing, an old RDB, an
  -- AOF); uptime dates that start.
  local info = redis.call('INFO', 'server')
  local run_id = string.match(info, 'run_id:(%x+)') or ''
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0') or 0
  local stored = redis.call('GET', KEYS[2]) or ''
  local seen_run, seen_epoch = string.match(stored, '^(%x*):(%d+)$')
  local epoch = tonumber(seen_epoch or '')
  if not epoch or epoch > now then
    -- No epoch: a data set the kit has not seen (new or wiped node), or one from the future
    -- (the clock stepped back): the guard starts now.
    epoch = now
  elseif seen_run ~= run_id then
    -- Restarted since the epoch was written: what it loaded may lack later locks. The guard
    -- runs from the start of this process. uptime_in_seconds counts wall-clock second
    -- boundaries crossed, so it can exceed the real uptime by almost a second: one second
    -- less keeps the epoch from being earlier than the real start.
    epoch = now - math.max(uptime - 1, 0) * 1000000
  end
  if seen_run ~= run_id or tonumber(seen_epoch or '') ~= epoch then
    redis.call('SET', KEYS[2], run_id .. ':' .. string.format('%.0f', epoch))
  end
  local young = guard - math.floor((now - epoch) / 1000)
  if young > 0 then
    return {2, young}
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', lease) then
  return {1, 0}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- A retry of our own acquire (its first reply was lost). Re-applying the lease is a write on
  -- this connection, so a WAIT that follows counts replicas of it (and of everything before
  -- it, the first grant included), not of nothing.
  redis.call('PEXPIRE', KEYS[1], lease)
  return {1, 0}
end
local flag = tonumber(ARGV[3]) or 0
if flag > 0 then
  redis.call('SET', ARGV[4], '1', 'PX', flag)
end
return {0, redis.call('PTTL', KEYS[1])}
