-- Logs a finished interval and removes its open section.
--
-- KEYS[1] open:<worker>  the worker's open sections, by id
-- KEYS[2] left:<worker>  the exits of those that left, by id
-- KEYS[3] log            the run's intervals
-- ARGV[1] the section's id
-- ARGV[2] the interval: JSON (Interval in record.rs)
--
-- Returns 1.

redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[2])
return 1
