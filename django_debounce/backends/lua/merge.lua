#!lua
-- The shebang (no allow-oom) makes Redis refuse it whole on a full Redis: the row path takes it.
-- A trigger on the Redis store (docs/design.md, "The counter and its fences"): absorbed by
-- the key's counter when it is open (not sealed, its expiry `x` not reached) and takes this
-- trigger's fingerprint (payload and options); else the trigger takes the row path.
-- Sent again (its reply lost), it finds its mark (ARGV[3] >= ARGV[4]) and counts nothing.
-- Python twin: KeyModel.fold (django_debounce/machine.py) applies what it counted.
-- KEYS[1] the counter; ARGV[1] fingerprint, ARGV[2] now in microseconds ("": Redis TIME),
-- ARGV[3] the caller's mark field, ARGV[4] this merge's number.
-- Returns {1, flight id, pending base + count, now} when absorbed, else {0, 0, 0, now}.
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local c = redis.call('HMGET', KEYS[1], 'f', 'x', 's', 'g', 'p', ARGV[3], 'n')
if tonumber(c[6] or -1) >= tonumber(ARGV[4]) then
  return {1, tonumber(c[4] or 0), tonumber(c[5] or 0) + tonumber(c[7] or 0), now}
end
if c[1] == ARGV[1] and not c[3] and tonumber(c[2]) > now then
  local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
  redis.call('HSET', KEYS[1], 't', now, ARGV[3], ARGV[4])
  return {1, tonumber(c[4]), tonumber(c[5]) + n, now}
end
return {0, 0, 0, now}
