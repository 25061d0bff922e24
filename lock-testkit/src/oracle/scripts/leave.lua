-- Leaves a critical section. Idempotent: the occupancy is decremented and the exit kept only
-- the first time.
--
-- KEYS[1] occ:<key>        the occupancy counter
-- KEYS[2] occupants:<key>  the sections inside (a hash by id, see enter.lua)
-- KEYS[3] open:<worker>    the worker's open sections, by id
-- KEYS[4] left:<worker>    the exits of those that left, by id
-- ARGV[1] the section's id
-- ARGV[2] the holder's record of its exit: JSON (Left in record.rs), kept for close_worker
--         should the process die before it finishes
--
-- Returns 1.

if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then redis.call('DECR', KEYS[1]) end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  redis.call('HSETNX', KEYS[4], ARGV[1], ARGV[2])
end
return 1
