-- Rebuild a flight from its durable record when its Redis state is gone (evicted, or Redis
-- restarted without persistence): the record says a flight was pending or a run was live.
-- ARGV (after the common header): [8] pending, [9] flight_id, [10] first_us, [11] last_us,
-- [12] due_us, [13] payload ('' none), [14] "run_id,triggers,runs,merged,cancelled",
-- [15] was running (0/1), [16] short readable key.
-- A live run's lease and claimed triggers are not in the record: the flight runs again (at
-- least once, I7). Returns 1 when the flight was rebuilt, 0 when Redis holds the key.
local c = single_ctx()
local h = c.h
if redis.call('EXISTS', h) == 1 then return 0 end
local now = clock()
local s, o = load_state(h)
local i = 0
for v in string.gmatch(ARGV[14], '[^,]+') do
  i = i + 1
  local n = tonumber(v)
  if i == 1 then s.r = n elseif i == 2 then s.T = n elseif i == 3 then s.R = n
  elseif i == 4 then s.M = n elseif i == 5 then s.C = n end
end
s.p = math.max(tonumber(ARGV[8]), 1)
s.f = tonumber(ARGV[9])
s.ft = tonumber(ARGV[10])
if s.ft <= 0 then s.ft = now end
s.lt = math.max(tonumber(ARGV[11]), s.ft)
s.an = s.ft
s.d = math.max(tonumber(ARGV[12]), 0)
if ARGV[15] == '1' or s.d <= 0 then s.d = now end
-- the record counted the triggers it knew; the rebuilt flight keeps I6 for them
s.T = math.max(s.T, s.R + s.M + s.C + s.p)
s.o = c.overlap
local extra = {}
if ARGV[13] ~= '' then extra = {'pl', ARGV[13]} end
if ARGV[16] ~= '' then extra[#extra + 1] = 'k'; extra[#extra + 1] = ARGV[16] end
save(h, s, o, extra)
reindex(s, c)
return 1
