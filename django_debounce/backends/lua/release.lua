-- A message that could not be published: its flight goes back to the index at its due time.
-- Twin of DatabaseBackend.release and KeyModel.release. ARGV[8]: the seq. Returns 1 if applied.
local c = single_ctx()
local h = c.h
if redis.call('EXISTS', h) == 0 then return 0 end
local s, o = load_state(h)
if s.tk == 0 or s.q ~= tonumber(ARGV[8]) then return 0 end
s.tk, s.ta = 0, 0
save(h, s, o)
reindex(s, c)
return 1
