-- The line of waiters, prepended to the scripts of the kinds that keep one (the fair lock's
-- fair_acquire.lua and release.lua, the semaphore's permit_acquire.lua and
-- permit_release.lua): one function, so every script drops the dead waiters the same way.
--
-- A line is two sorted sets: the waiters scored by arrival (server clock, us), and the same
-- waiters scored by when they stop counting as alive (server clock, ms), which each try of a
-- waiter renews.
--
-- first_in_line(line, alive, now_ms) drops the waiters whose liveness ended by now_ms from
-- both sets and returns the first waiter left in line, or nil when nobody is.
local function first_in_line(line, alive, now_ms)
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', string.format('%.0f', now_ms))
  if #dead > 0 then
    redis.call('ZREM', alive, unpack(dead))
    redis.call('ZREM', line, unpack(dead))
  end
  return redis.call('ZRANGE', line, 0, 0)[1]
end
