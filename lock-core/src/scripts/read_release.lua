-- Release a read lock if, and only if, the caller's token still holds it; leave a latch that
-- proves it. A reader holds it while its entry's lease runs *and* the lock key holds the
-- `readers` marker: an entry alone is not enough, since a writer's token may have replaced the
-- marker (a marker that ran out early, a server clock step) and then exclusion was broken; such
-- a release removes the entry and reports the lock lost. The last reader out removes the marker
-- from the lock key and, if a writer waits (an entry scored from 0 up in the waiting marks; the
-- readers' mark is -1), tells it on the channel
-- (its entry stays: it keeps new readers out until that writer got its turn, and its grant
-- removes it).
--
-- KEYS[1]  the lock key (see read_acquire.lua for the layout)
-- KEYS[2]  the waiting marks of the lock key (see acquire.lua and read_acquire.lua)
-- KEYS[3]  the readers set of the lock key
-- KEYS[4]  (only with a release retry window) the release latch of this token
-- ARGV[1]  the caller's token
-- ARGV[2]  (only with KEYS[4]) how long the latch lives, in milliseconds: the release retry
--          window (see latch.lua)
--
-- The message on the release channel (release_channel, see channel.lua) is '1'.
--
-- KEYS[2] to KEYS[4] are in the hash slot of KEYS[1], and declared although they usually do
-- not exist, so a migrating Cluster slot refuses the call before it writes anything (see
-- release.lua).
--
-- Returns, as release.lua: 1 released now, 2 released now as the last reader and a writer
-- waits (it was told), 3 or 4 the latch says an earlier try of this release did that (its reply
-- was lost; a retry is recognised so even if a writer took the lock since), -1 no live lease of
-- this token or no marker, and no latch (the entry had been cleared, or the set or the marker
-- deleted: the lock was lost before any release of ours ran), -2 the entry was there but its
-- lease had ended, 0 the lock key holds another value (a writer's token) while our entry's
-- lease runs, or is of another type. In the lost cases the entry is removed.
local now = server_ms()
local ok, current = pcall(redis.call, 'GET', KEYS[1])
local score = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]) or '')
if ok and current == 'readers' and score and score > now then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now))
  local answer = 1
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if last[2] then
    -- Readers remain: the marker lives as long as the longest of their leases.
    local ttl = math.max(tonumber(last[2]) - now, 1)
    redis.call('SET', KEYS[1], 'readers', 'PX', ttl)
  else
    redis.call('DEL', KEYS[1])
    if writer_waits(KEYS[2]) then
      redis.pcall('PUBLISH', release_channel(KEYS[1]), '1')
      answer = 2
    end
  end
  leave_latch(KEYS[4], answer, ARGV[2])
  return answer
end
if score then
  -- Not ours any more (expired, or the marker is gone or replaced): the entry goes. An entry
  -- still there means no earlier try of this release ran (it removes the entry), so the latch
  -- need not be asked.
  redis.call('ZREM', KEYS[3], ARGV[1])
  if score <= now then
    return -2
  end
  if ok and not current then
    return -1
  end
  return 0
end
local earlier = latched(KEYS[4])
if earlier then
  return earlier
end
if not ok then
  return 0
end
return -1
