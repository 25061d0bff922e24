-- Enters a critical section: occupancy, fence claim and the open record in one step, so that
-- a holder killed right after it leaves a record for close_worker.
--
-- KEYS[1] occ:<key>        the occupancy counter
-- KEYS[2] occupants:<key>  the sections inside: a hash, id -> access code (see ARGV[4])
-- KEYS[3] fence:<key>      the fenced resource's high-water mark
-- KEYS[4] open:<worker>    the worker's open sections, by id
-- KEYS[5] seq              the run's sequence (shared with write.lua)
-- KEYS[6] stats            the run's counters
-- ARGV[1] the section's id
-- ARGV[2] its fencing token, in decimal; 0 for none (an exclusive holder that did not ask
--         for one claims nothing)
-- ARGV[3] the holder's record of its enter: a JSON object (Entered in record.rs)
-- ARGV[4] its access: x (exclusive: alone), s (shared: with other shared sections only),
--         p (permit: with other permit sections, at most ARGV[5] at once)
-- ARGV[5] for p, the number of permits (>= 1)
--
-- Stores and returns the open section: ARGV[3] with the referee's fields added, enter_seq,
-- occupancy (every section inside, this one included), below_high_water (the token was not
-- above the mark; only exclusive sections with a token claim it) and collided_with (the ids that
-- were inside against the rules of ARGV[4], left out when there were none: for p, the
-- non-permit ones, and every permit holder when ARGV[5] of them were inside already).

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

local access = ARGV[4]
local inside = redis.call('HGETALL', KEYS[2])
local others = {}
local permits = {}
for i = 1, #inside, 2 do
  local id, other = inside[i], inside[i + 1]
  if access == 'x' or other ~= access or other == 'x' then
    table.insert(others, id)
  elseif access == 'p' then
    table.insert(permits, id)
  end
end
if access == 'p' and #permits >= tonumber(ARGV[5]) then
  for _, id in ipairs(permits) do table.insert(others, id) end
end
redis.call('HSET', KEYS[2], ARGV[1], access)
local occ = redis.call('INCR', KEYS[1])
local seq = redis.call('INCR', KEYS[5])
redis.call('HINCRBY', KEYS[6], 'enters', 1)
if #others > 0 then redis.call('HINCRBY', KEYS[6], 'occupancy_collisions', 1) end
if occ > tonumber(redis.call('HGET', KEYS[6], 'max_occupancy') or '0') then
  redis.call('HSET', KEYS[6], 'max_occupancy', occ)
end
local below = false
if access == 'x' and ARGV[2] ~= '0' then
  local hw = redis.call('GET', KEYS[3]) or '0'
  if gt(ARGV[2], hw) then
    redis.call('SET', KEYS[3], ARGV[2])
  else
    below = true
    redis.call('HINCRBY', KEYS[6], 'claims_below_high_water', 1)
  end
end
local fields = {enter_seq = seq, occupancy = occ, below_high_water = below}
-- cjson encodes an empty table as an object.
if #others > 0 then fields.collided_with = others end
local section = with_fields(ARGV[3], fields)
redis.call('HSET', KEYS[4], ARGV[1], section)
return section
