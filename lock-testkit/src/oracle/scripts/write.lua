-- A write to the fenced resource: accepted only with a token at least as high as the highest
-- one seen for the key (a higher one raises the mark), and logged either way.
--
-- KEYS[1] fence:<key>  the high-water mark
-- KEYS[2] seq          the run's sequence (shared with enter.lua)
-- KEYS[3] writes       the run's write log
-- KEYS[4] stats        the run's counters
-- ARGV[1] the write's fencing token, in decimal
-- ARGV[2] the writer's request: a JSON object (WriteRequest in record.rs)
--
-- Logs ARGV[2] with the script's fields added, seq and accepted (FencedWrite in record.rs).
-- Returns 1 if the write was accepted, else 0.

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

local hw = redis.call('GET', KEYS[1]) or '0'
local seq = redis.call('INCR', KEYS[2])
local ok = 0
if gt(hw, ARGV[1]) then
  redis.call('HINCRBY', KEYS[4], 'writes_rejected', 1)
else
  ok = 1
  if gt(ARGV[1], hw) then redis.call('SET', KEYS[1], ARGV[1]) end
  redis.call('HINCRBY', KEYS[4], 'writes_accepted', 1)
end
redis.call('RPUSH', KEYS[3], with_fields(ARGV[2], {seq = seq, accepted = ok == 1}))
return ok
