-- The release channel of a lock, prepended to the release scripts (release.lua,
-- fair_release.lua, read_release.lua, permit_release.lua): one function, so each names the
-- channel its waiters listen on (`RedisKeys::channel`) the same way.
--
-- release_channel(main) returns the release channel of the lock whose main key is `main`
-- (KEYS[1]): `p{h}:lock:k` -> `p{h}:released:k`, `p{h}:semaphore:k` ->
-- `p{h}:semaphore-released:k`. The prefix holds no brace (the kit checks it), so the first
-- `}:` ends the hash tag whatever the user's key holds.
--
-- A release builds it only when it publishes. Sent as an argument, it would cost Redis a
-- string of its own on every release, the hot path's, although most releases tell nobody.
local function release_channel(main)
  local tag_end = string.find(main, '}:', 1, true)
  local word_end = string.find(main, ':', tag_end + 2, true)
  local word = string.sub(main, tag_end + 2, word_end - 1)
  local sibling = word == 'lock' and 'released' or word .. '-released'
  return string.sub(main, 1, tag_end + 1) .. sibling .. string.sub(main, word_end)
end
