-- Enters a critical section: occupancy, fence claim and the open record in one step, so that
-- a holder killed right after it leaves a record for close_worker.
--
-- KEYS[1] occ:<key>        the occupancy counter
-- KEYS[2] occupants:<key>  ids of the sections inside
-- KEYS[3] fence:<key>      the fenced resource's high-water mark
-- KEYS[4] open:<worker>    the worker's open sections, by id
-- KEYS[5] seq              the run's sequence (shared with write.lua)
-- KEYS[6] stats            the run's counters
-- ARGV[1] the section's id
-- ARGV[2] its fencing token, in decimal
-- ARGV[3] the holder's record of its enter: a JSON object (Entered in record.rs)
--
-- Stores and returns the open section: ARGV[3] with the referee's fields added, enter_seq,
-- occupancy, below_high_water (the token was not above the mark) and collided_with (the ids
-- that were inside, left out when there were none).

-- Compares two decimal strings without leading zeros as numbers (exact for any length: Lua
-- numbers are doubles).
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end

-- Adds the fields of the table `fields` to the JSON object `json` without decoding it: cjson
-- would turn its 64-bit integers into doubles. `json` and `fields` are not empty.
local function with_fields(json, fields)
  return string.sub(json, 1, -2) .. ',' .. string.sub(cjson.encode(fields), 2)
end

local others = redis.call('SMEMBERS', KEYS[2])
redis.call('SADD', KEYS[2], ARGV[1])
local occ = redis.call('INCR', KEYS[1])
local seq = redis.call('INCR', KEYS[5])
redis.call('HINCRBY', KEYS[6], 'enters', 1)
if occ > 1 then redis.call('HINCRBY', KEYS[6], 'occupancy_collisions', 1) end
local hw = redis.call('GET', KEYS[3]) or '0'
local below = false
if gt(ARGV[2], hw) then
  redis.call('SET', KEYS[3], ARGV[2])
else
  below = true
  redis.call('HINCRBY', KEYS[6], 'claims_below_high_water', 1)
end
local fields = {enter_seq = seq, occupancy = occ, below_high_water = below}
-- cjson encodes an empty table as an object.
if #others > 0 then fields.collided_with = others end
local section = with_fields(ARGV[3], fields)
redis.call('HSET', KEYS[4], ARGV[1], section)
return section
