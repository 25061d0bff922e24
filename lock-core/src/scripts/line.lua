-- The line of waiters, prepended to the scripts of the kinds that keep one (the fair lock's
-- fair_acquire.lua and release.lua, the semaphore's permit_acquire.lua and
-- permit_release.lua), after clock.lua: one function, so every script drops the dead waiters the
-- same way.
--
-- A line is two sorted sets: the waiters scored by arrival (server clock, us), and the same
-- waiters scored by when they stop counting as alive (server clock, ms), which each try of a
-- waiter renews.
--
-- first_in_line(line, alive, now_ms) drops the waiters whose liveness ended by now_ms from
-- both sets and returns the first waiter left in line, or nil when nobody is.
--
-- join_line(line, alive, waiter, time, stay_ms) puts the waiter in line (once: the first
-- arrival keeps its place; `time` is the reply of TIME) and counts it alive for stay_ms from
-- now; the line lives as long as its last waiter may.
--
-- `line` and `alive` are always names the calling script declared in its KEYS (see
-- acquire.lua on why every key a script touches is declared).
local function first_in_line(line, alive, now_ms)
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', string.format('%.0f', now_ms))
  if #dead > 0 then
    redis.call('ZREM', alive, unpack(dead))
    redis.call('ZREM', line, unpack(dead))
  end
  return redis.call('ZRANGE', line, 0, 0)[1]
end

local function join_line(line, alive, waiter, time, stay_ms)
  local arrival = string.format('%.0f', tonumber(time[1]) * 1000000 + tonumber(time[2]))
  local now_ms = server_ms(time)
  redis.call('ZADD', line, 'NX', arrival, waiter)
  redis.call('ZADD', alive, string.format('%.0f', now_ms + stay_ms), waiter)
  if redis.call('PTTL', line) < stay_ms then
    redis.call('PEXPIRE', line, stay_ms)
    redis.call('PEXPIRE', alive, stay_ms)
  end
end
