-- The server's clock, prepended to the scripts that read it in milliseconds (before line.lua,
-- which reads it too): one function, so every script reads it the same way.
--
-- server_ms(time) returns the server's clock in whole milliseconds: of `time`, a reply of TIME
-- the script read already (to date two things by one reading), or else of a TIME read now.
local function server_ms(time)
  time = time or redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
