-- Raise a key's fence counter to at least a given token (RedLock: after a quorum acquire the
-- largest token issued by any node is written back to every node of the quorum, so the next
-- quorum, which shares at least one node with this one, issues a larger token).
-- fence_expiry.lua is prepended to this script.
--
-- KEYS[1]  the lock key (its TTL is the least the fence key lives)
-- KEYS[2]  the fence key
-- ARGV[1]  the token to raise the counter to
-- ARGV[2]  the window: how long the fence key outlives both the lock and the token, in
--          milliseconds (>= 1)
--
-- Returns 1.
--
-- The fence key expires at an absolute time of this node's clock, max(the lock's end, the
-- counter) + the window (see fence.lua), and never earlier than it already would: a token
-- issued by a node whose clock runs ahead keeps this node's counter until this node's clock
-- passed it, so this node's later tokens are larger.
local window = tonumber(ARGV[2])
if not window or window < 1 then
  return redis.error_reply('ERR fence window must be at least 1 ms')
end
local now = redis.call('TIME')
local now_ms = math.floor((tonumber(now[1]) * 1000000 + tonumber(now[2])) / 1000)
local current = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local wanted = tonumber(ARGV[1])
local counter = math.max(current, wanted)
local expires = fence_expiry(KEYS[1], KEYS[2], now_ms, counter, window)
if wanted > current then
  redis.call('SET', KEYS[2], ARGV[1], 'PXAT', string.format('%.0f', expires))
else
  redis.call('PEXPIREAT', KEYS[2], string.format('%.0f', expires))
end
return 1
