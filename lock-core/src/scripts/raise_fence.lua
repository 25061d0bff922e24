-- Raise a key's fence counter to at least a given token (RedLock: after a quorum acquire the
-- largest token issued by any node is written back to every node of the quorum, so the next
-- quorum, which shares at least one node with this one, issues a larger token).
--
-- KEYS[1]  the fence key
-- ARGV[1]  the token to raise the counter to
-- ARGV[2]  how long the fence key lives, in milliseconds (>= 1)
--
-- Returns 1.
local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local wanted = tonumber(ARGV[1])
if wanted > current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
