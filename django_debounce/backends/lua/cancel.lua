-- Drop the pending flight and reset the edge. ARGV: now_us (0: Redis TIME), grace_us, ttl_ms.
-- Returns {dropped, snapshot}.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0, {}} end
local now = clock()
local s = load_state(h)
if s.p == 0 then
  -- nothing to drop, but the key's last trigger time goes, as lodash's cancel() clears
  -- lastCallTime: the next trigger of a leading task leads at once (also while a run is live)
  if s.lt == 0 then return {0, {}} end
  redis.call('HSET', h, 'lt', '0')
  return {0, snapshot(h)}
end
local dropped = s.p
s.C = s.C + dropped
s.p = 0
s.ft, s.an, s.lt, s.d, s.df, s.ra, s.nb = 0, 0, 0, 0, 0, 0, 0
s.q = s.q + 1
s.sc = 0
s.sa = 0
if s.cl > 0 then redis.call('DEL', KEYS[2]) end
save(h, s, now, tonumber(ARGV[3]), tonumber(ARGV[2]), {'pl', ''})
return {dropped, snapshot(h)}
