-- The restart guard, prepended to the acquire scripts (acquire.lua, read_acquire.lua,
-- fair_acquire.lua, permit_acquire.lua): one function, so all check a node's age the same way.
--
-- restart_guard(epoch_key, guard_ms) returns how many more milliseconds the node grants
-- nothing (<= 0: it may grant). epoch_key holds "<run_id>:<epoch>", where epoch is when, by
-- this server's clock in microseconds, its current data set began. A node that lost its data
-- (a restart without persistence or from an older snapshot, a flush) may have forgotten locks
-- it granted, so it grants nothing until they have surely expired.
--
-- epoch_key is declared, as the last of the acquire script's KEYS (only when the guard is on),
-- like every key a script touches. Unlike the others it is not in the lock's hash slot: it
-- dates the whole server, so it is one key per server, not one per lock. A Redis Cluster
-- refuses a script whose keys are in different slots (CROSSSLOT), and an epoch per slot would
-- not date the node, so the builder refuses the guard in a Cluster
-- (ConfigError::RestartGuardInCluster) and the key is only ever sent to a single server, a
-- Sentinel primary or a RedLock node, where every key is local.
local function restart_guard(epoch_key, guard_ms)
  local guard = tonumber(guard_ms) or 0
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  -- run_id changes at every start of the server, whatever it loaded (nothing, an old RDB, an
  -- AOF); uptime dates that start.
  local info = redis.call('INFO', 'server')
  local run_id = string.match(info, 'run_id:(%x+)') or ''
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0') or 0
  local stored = redis.call('GET', epoch_key) or ''
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
    redis.call('SET', epoch_key, run_id .. ':' .. string.format('%.0f', epoch))
  end
  return guard - math.floor((now - epoch) / 1000)
end
