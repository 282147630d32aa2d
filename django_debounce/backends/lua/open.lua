#!lua
-- The shebang (no allow-oom) makes Redis refuse it whole on a full Redis: no counter is made.
-- Make the counter of an open flight after the row path committed it (docs/design.md, fences
-- 1 and 2). Refused once Redis's clock passes the counter's expiry `x` (a creation delayed by
-- a paused client or a paused Redis), or when the key holds a counter or tombstone of this
-- id or a later one.
-- KEYS[1] the counter; ARGV: id, fingerprint, x, flight id, pending base, now ("": TIME).
-- Returns 1 when made, else 0.
local now = tonumber(ARGV[6])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local x = tonumber(ARGV[3])
if x <= now then
  return 0
end
local cur = tonumber(redis.call('HGET', KEYS[1], 'i'))
if cur and cur >= tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'i', ARGV[1], 'n', 0, 'f', ARGV[2], 'x', ARGV[3], 'g', ARGV[4], 'p', ARGV[5])
redis.call('PEXPIRE', KEYS[1], math.floor((x - now) / 1000) + 1000)
return 1
