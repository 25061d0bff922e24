-- Leaves a critical section. Idempotent: the occupancy is decremented and the exit recorded
-- only the first time.
--
-- KEYS[1] occ:<key>, KEYS[2] occupants:<key>, KEYS[3] open:<worker>
-- ARGV[1] id, ARGV[2] t_exit, ARGV[3] last_held, ARGV[4] lost_at ('-' when none)
--
-- Appends t_exit, last_held, lost_at to the open record (kept for close_worker, should the
-- process die before it finishes).
-- Returns 1.

if redis.call('SREM', KEYS[2], ARGV[1]) == 1 then redis.call('DECR', KEYS[1]) end
local v = redis.call('HGET', KEYS[3], ARGV[1])
if v then
  local _, tabs = string.gsub(v, '\t', '')
  if tabs == 7 then
    redis.call('HSET', KEYS[3], ARGV[1], table.concat({v, ARGV[2], ARGV[3], ARGV[4]}, '\t'))
  end
end
return 1
