-- The release latch, prepended to the release scripts (release.lua, read_release.lua,
-- permit_release.lua): two functions, so every kind's retry reads what its first try left the
-- same way (see release.lua on why a release leaves a latch).
--
-- leave_latch(latch, answer, ms) records the answer (1 or 2) of a release that ended the
-- caller's hold, for `ms` milliseconds (ARGV of the script: '0' leaves no latch).
--
-- latched(latch) returns what a retry answers when an earlier try of the release left its latch
-- (3 or 4: that try's answer plus 2), or false when there is none.
local function leave_latch(latch, answer, ms)
  if ms ~= '0' then
    redis.call('SET', latch, tostring(answer), 'PX', ms)
  end
end

local function latched(latch)
  local answer = redis.call('GET', latch)
  return answer and tonumber(answer) + 2
end
