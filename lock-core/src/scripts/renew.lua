-- Renew a batch of locks, each only if it is still held by the given token.
--
-- KEYS[i]     the lock keys
-- ARGV[1]     the new lease in milliseconds (>= 1; PEXPIRE with 0 or less would delete the key)
-- ARGV[2i]    the token expected in KEYS[i]
-- ARGV[2i+1]  for a read lock, the readers set of KEYS[i] (see read_acquire.lua), a key name in
--             its hash slot; empty for an exclusive lock
--
-- Returns an array with one entry per key: 1 renewed, 0 not held by that token (expired,
-- deleted, taken over, or a key of another type).
local lease = tonumber(ARGV[1])
if not lease or lease < 1 then
  return redis.error_reply('ERR lock lease must be at least 1 ms')
end
local now
local result = {}
for i, key in ipairs(KEYS) do
  local token, readers = ARGV[2 * i], ARGV[2 * i + 1]
  local ok, current = pcall(redis.call, 'GET', key)
  result[i] = 0
  if ok and readers == '' and current == token then
    redis.call('PEXPIRE', key, lease)
    result[i] = 1
  elseif ok and readers ~= '' and current == 'readers' then
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local score = tonumber(redis.call('ZSCORE', readers, token) or '')
    if score and score > now then
      redis.call('ZADD', readers, 'XX', string.format('%.0f', now + lease), token)
      -- The marker lives as long as the longest reader lease (this one may have shortened).
      local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
      local ttl = math.max(tonumber(last[2]) - now, 1)
      redis.call('SET', key, 'readers', 'PX', ttl)
      redis.call('PEXPIRE', readers, ttl)
      result[i] = 1
    end
  end
end
return result
