-- Drop the pending flight and reset the edge, as lodash's cancel(): the next trigger starts a
-- new burst. Twin of DatabaseBackend.cancel and KeyModel.cancel. Returns the triggers dropped.
local c = single_ctx()
local h = c.h
if redis.call('EXISTS', h) == 0 then return 0 end
local now = clock()
local s, o = load_state(h)
s.lt = 0
local dropped = s.p
if dropped > 0 then
  s.C = s.C + dropped
  s.p = 0
  s.ft, s.an, s.bd, s.d, s.df, s.ra, s.ac, s.nb = 0, 0, 0, 0, 0, 0, 0, 0
  next_seq(s, now)  -- any message out is now stale
  s.tk, s.ta = 0, 0
  if s.cs > 0 then redis.call('DEL', c.items) end
end
save(h, s, o, {'pl', ''})
reindex(s, c)
if dropped > 0 then record(c, 's', now, s, 0) end
return dropped
