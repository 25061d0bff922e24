-- Enters a critical section: occupancy, fence claim and the open record, in one step so that a
-- holder killed right after it leaves a record that close_worker can find.
--
-- KEYS[1] occ:<key>        occupancy counter
-- KEYS[2] occupants:<key>  ids of the sections inside
-- KEYS[3] fence:<key>      the fenced resource's high-water mark
-- KEYS[4] open:<worker>    open records of the worker, by id
-- KEYS[5] seq              the run's sequence (shared with write.lua)
-- KEYS[6] stats            the run's counters
-- ARGV[1] id, ARGV[2] fencing token (decimal), ARGV[3] t_enter, ARGV[4] key,
-- ARGV[5] last_held, ARGV[6] lost_at ('-' when none)
--
-- Stores the open record: key, fence, t_enter, seq, occupancy, others, last_held, lost_at
-- (tab-separated).
-- Returns {occupancy, seq, 1 if the token was not above the high-water mark else 0,
-- the ids already inside joined by ','}.

-- Compares two decimal strings without leading zeros as numbers (exact for any length: Lua
-- numbers are doubles).
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

local others = table.concat(redis.call('SMEMBERS', KEYS[2]), ',')
redis.call('SADD', KEYS[2], ARGV[1])
local occ = redis.call('INCR', KEYS[1])
local seq = redis.call('INCR', KEYS[5])
redis.call('HINCRBY', KEYS[6], 'enters', 1)
if occ > 1 then redis.call('HINCRBY', KEYS[6], 'occupancy_collisions', 1) end
local hw = redis.call('GET', KEYS[3]) or '0'
local regression = 0
if gt(ARGV[2], hw) then
  redis.call('SET', KEYS[3], ARGV[2])
else
  regression = 1
  redis.call('HINCRBY', KEYS[6], 'claims_below_high_water', 1)
end
redis.call('HSET', KEYS[4], ARGV[1], table.concat(
  {ARGV[4], ARGV[2], ARGV[3], tostring(seq), tostring(occ), others, ARGV[5], ARGV[6]}, '\t'))
return {occ, seq, regression, others}
