#!lua flags=allow-oom
-- Seal the counter of id ARGV[1] (or an older one) before a step decides on the flight
-- (docs/design.md, fence 3): read what it counted and leave a tombstone of that id, which
-- refuses merges and any late open of an id up to it, until ARGV[2] microseconds from now,
-- and gives the same count to a seal of the same id again (its first step rolled back): a
-- tombstone that keeps a count lives at least ARGV[4] microseconds (until the step's retry).
-- Flagged allow-oom: it works on a full Redis (it adds one field at most).
-- KEYS[1] the counter; ARGV: id, tombstone life (us), now ("": TIME), kept count's life (us).
-- Returns {count, age of the last counted trigger in us, fingerprint}; {0} when nothing
-- was counted; {-1} when the key holds a later counter (nothing touched).
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local id = tonumber(ARGV[1])
local c = redis.call('HMGET', KEYS[1], 'i', 'n', 't', 'f', 's')
local cur = tonumber(c[1])
if cur and cur > id then
  return {-1}
end
local out = {0}
local n = tonumber(c[2])
-- a tombstone of this very id keeps what its seal read: a step that sealed and then failed
-- to commit (the row still names the counter) reads it again
if cur and n and n > 0 and (not c[5] or cur == id) then
  out = {n, now - tonumber(c[3]), c[4]}
end
local life = math.max(tonumber(ARGV[2]), 0)
-- the flight id, pending base and merge marks stay (a merge sent again finds its mark)
redis.call('HDEL', KEYS[1], 'n', 't', 'f')
redis.call('HSET', KEYS[1], 'i', id, 's', 1, 'x', now + life)
if out[1] > 0 then
  redis.call('HSET', KEYS[1], 'n', out[1], 't', now - out[2], 'f', out[3])
  life = math.max(life, tonumber(ARGV[4]) or 0)
end
redis.call('PEXPIRE', KEYS[1], math.floor(life / 1000) + 1000)
return out
