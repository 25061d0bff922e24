-- Logs a finished interval and removes its open section, once: a section is logged by
-- whichever comes first of its holder's finish and close_worker (a SIGKILLed holder's last
-- finish can reach the referee after close_worker read the section as open), never twice.
--
-- KEYS[1] open:<worker>  the worker's open sections, by id
-- KEYS[2] left:<worker>  the exits of those that left, by id
-- KEYS[3] log            the run's intervals
-- ARGV[1] the section's id
-- ARGV[2] the interval: JSON (Interval in record.rs)
--
-- Returns 1 when it logged the interval, 0 when the section had been logged already.

if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[2])
return 1
