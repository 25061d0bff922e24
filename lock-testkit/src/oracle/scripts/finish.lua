-- Logs a finished interval and removes its open record.
--
-- KEYS[1] open:<worker>, KEYS[2] log
-- ARGV[1] id, ARGV[2] the interval's log line
--
-- Returns 1.

redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
