-- When a fence key may expire, prepended to fence.lua and raise_fence.lua: one function, so a
-- token issued and a token written back keep the counter alike.
--
-- fence_expiry(lock, fence, now_ms, counter, window) returns the absolute time (server clock,
-- ms) at which the fence key `fence` of the lock key `lock` may expire once it holds `counter`
-- (a token, in microseconds): max(the lock's end, the counter) + window, and never earlier than
-- the fence key already would. Redis deletes it only once its clock has read past the counter,
-- so every later token, whose clock term is larger, is larger (see fence.lua).
local function fence_expiry(lock, fence, now_ms, counter, window)
  local lock_ttl = math.max(redis.call('PTTL', lock), 0)
  local expires = math.max(now_ms + lock_ttl, math.ceil(counter / 1000)) + window
  local fence_ttl = redis.call('PTTL', fence)
  if fence_ttl > 0 then
    expires = math.max(expires, now_ms + fence_ttl)
  end
  return expires
end
