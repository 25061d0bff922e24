-- The waiting marks of a lock key (`p{h}:waiters:k`), composed into the scripts that ask
-- whether a writer waits (read_acquire.lua, read_release.lua, release.lua, fair_release.lua,
-- withdraw.lua): one function, so each tells a writer's entry from the readers' mark the same
-- way.
--
-- Writers' entries are their tokens, scored 0 (acquire.lua, fair_acquire.lua); the readers'
-- mark is the member `readers`, scored -1 (read_acquire.lua), and is never a writer.
--
-- writer_waits(set) returns whether `set` (KEYS of the caller) holds a writer's entry.
local function writer_waits(set)
  return redis.call('ZRANGEBYSCORE', set, 0, '+inf', 'LIMIT', 0, 1)[1] ~= nil
end
