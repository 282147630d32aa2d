-- Make the pending flight due now (a retry backoff included). Twin of DatabaseBackend.flush
-- and KeyModel.flush. Returns {seq, countdown} ({0, 0}: nothing to publish).
local c = single_ctx()
local h = c.h
if redis.call('EXISTS', h) == 0 then return {'0', '0'} end
local now = clock()
local s, o = load_state(h)
if s.p == 0 then return {'0', '0'} end
s.d = now
s.nb = 0
local seq, cd = 0, 0
if s.ru > 0 and tonumber(ARGV[3]) == 0 then
  s.tk, s.ta = 0, 0  -- the live run's finish schedules it
else
  seq, cd = schedule(s, now, now, c)
end
save(h, s, o)
reindex(s, c)
return {fmt(seq), fmt(cd)}
