-- The release latch, prepended to the release scripts (release.lua, fair_release.lua,
-- read_release.lua, permit_release.lua): two functions, so every kind's retry reads what its
-- first try left the same way (see release.lua on why a release may leave a latch).
--
-- The latch's name is the release script's last KEY, sent only when the release retry window
-- is not zero (the default is zero: no latch). A name that is sent costs Redis a string on
-- every call (the hot path's release), so with no window it is not sent, and `latch` is nil.
--
-- leave_latch(latch, answer, ms) records the answer (1 or 2) of a release that ended the
-- caller's hold, for `ms` milliseconds (ARGV of the script); nothing when `latch` is nil.
--
-- latched(latch) returns what a retry answers when an earlier try of the release left its latch
-- (3 or 4: that try's answer plus 2), or false when there is none (or no latch is kept).
local function leave_latch(latch, answer, ms)
  if latch then
    redis.call('SET', latch, tostring(answer), 'PX', ms)
  end
end

local function latched(latch)
  local answer = latch and redis.call('GET', latch)
  return answer and tonumber(answer) + 2
end
