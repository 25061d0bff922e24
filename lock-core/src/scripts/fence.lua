-- Issue the next fencing token of a lock to its holder, only while it holds the lock.
-- fence_expiry.lua is prepended to this script.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the fence key (the last fencing token issued for this lock key)
-- ARGV[1]  the holder's token
-- ARGV[2]  the window: how long the fence key outlives both the lock and its own token, in
--          milliseconds (>= 1)
--
-- Returns the token (> 0), or -1 when the lock is not held by ARGV[1] (expired, deleted, taken
-- over, or a key of another type): a holder that lost its lock gets no token.
--
-- The token is the server's clock in microseconds, or last + 1 when that is not larger, so
-- tokens strictly increase in the order of the holders (each gets its token while it holds, so
-- after every earlier holder got theirs) while the fence key lives. The fence key expires at
-- an absolute time of the server's clock, max(the lock's end, the token) + the window, and
-- never earlier than it already would: Redis deletes it only once its clock has read past the
-- token, so the clock term of any later token is larger, whatever the clock did meanwhile. Only
-- a backward step of the clock after that (larger than the window plus the key's idle time)
-- can issue a smaller token. Renewals carry the fence key along with the lock (renew.lua).
local ok, current = pcall(redis.call, 'GET', KEYS[1])
if not ok or current ~= ARGV[1] then
  return -1
end
local window = tonumber(ARGV[2])
if not window or window < 1 then
  return redis.error_reply('ERR fence window must be at least 1 ms')
end
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local now_ms = math.floor(now_us / 1000)
local fence = now_us
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if fence <= last then
  fence = last + 1
end
local expires = fence_expiry(KEYS[1], KEYS[2], now_ms, fence, window)
redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PXAT', string.format('%.0f', expires))
return fence
