-- Logs a finished interval and removes its open section. A section is logged once, and its
-- holder's own record wins: a SIGKILLed holder's last finish can reach the referee after
-- close_worker read the section as open and logged it as killed; that finish then replaces
-- the killed copy (it carries what the release answered and when the holder really left).
--
-- KEYS[1] open:<worker>    the worker's open sections, by id
-- KEYS[2] left:<worker>    the exits of those that left, by id
-- KEYS[3] log              the run's intervals
-- KEYS[4] closed:<worker>  where close_worker logged the worker's sections: id -> position in
--                          the log
-- ARGV[1] the section's id
-- ARGV[2] the interval: JSON (Interval in record.rs)
-- ARGV[3] 'killed' when close_worker logs the section of a dead holder, 'own' for the
--         holder's finish
--
-- Returns 1 when it logged the interval (or replaced the killed copy with it), 0 when there
-- was nothing to log: close_worker after the holder's finish.

if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  local length = redis.call('RPUSH', KEYS[3], ARGV[2])
  if ARGV[3] == 'killed' then
    redis.call('HSET', KEYS[4], ARGV[1], length - 1)
  end
  return 1
end
if ARGV[3] == 'killed' then
  return 0
end
local at = redis.call('HGET', KEYS[4], ARGV[1])
if not at then
  return 0
end
redis.call('LSET', KEYS[3], at, ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
