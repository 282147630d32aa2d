-- ARGV: key, task_name, payload, wait_us, max_wait_us (-1: none), grace_us, ttl_ms, seq_base,
--       seed ("" or "run_id,flight_id,triggers,runs,merged,cancelled" of the durable record),
--       overlap (0/1)
-- A key new to Redis returns {'seed'} without writing when no seed is given: the caller reads
-- the durable record and calls again, so counters continue where the database left them.
local h = KEYS[1]
local fresh = redis.call('EXISTS', h) == 0
if fresh and ARGV[9] == '' then return {'seed'} end
local now = clock()
local s = load_state(h)
if fresh then
  s.q = tonumber(ARGV[8])
  local i = 0
  for v in string.gmatch(ARGV[9], '[^,]+') do
    i = i + 1
    local n = tonumber(v)
    if i == 1 then s.r = n elseif i == 2 then s.f = n elseif i == 3 then s.T = n
    elseif i == 4 then s.R = n elseif i == 5 then s.M = n elseif i == 6 then s.C = n end
  end
end
local lost = recover_lease(h, s, now)
local prev_pl = redis.call('HGET', h, 'pl') or ''
local prev_lt, prev_d = s.lt, s.d
local opened = 0
if s.p == 0 then
  s.f = s.f + 1
  s.ft = now
  opened = 1
end
s.p = s.p + 1
s.T = s.T + 1
s.lt = now
local due = now + tonumber(ARGV[4])
local max_wait = tonumber(ARGV[5])
if max_wait >= 0 then due = math.min(due, s.ft + max_wait) end
s.d = due
local grace = tonumber(ARGV[6])
local seq, countdown, kind = 0, 0, ''
if s.ru > 0 and ARGV[10] == '0' then
  -- the finishing run schedules this flight; at most a lease watchdog is published
  local at, cd = watchdog(s, now)
  if at > 0 then seq, countdown, kind = at, cd, 'watch' end
elseif s.sc == 0 or s.sa + grace < now then
  countdown = schedule(s, due, now)
  seq = s.q
  kind = 'fire'
end
local extra = {'pl', ARGV[3]}
if fresh then extra = {'pl', ARGV[3], 'k', ARGV[1], 'tn', ARGV[2]} end
save(h, s, now, tonumber(ARGV[7]), grace, extra)
local snap = {}
if opened == 1 or lost > 0 then snap = snapshot(h) end
return {s.f, s.p, fmt(s.d), fmt(seq), fmt(countdown), opened, prev_pl, fmt(prev_lt), fmt(prev_d),
        fmt(now), lost, snap, kind}
