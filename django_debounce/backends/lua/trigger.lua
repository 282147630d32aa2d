-- ARGV: key, task_name, payload, wait_us, max_wait_us (-1: none), grace_us, ttl_ms, seq_base
local h = KEYS[1]
local now = clock()
local s = load_state(h)
local fresh = redis.call('EXISTS', h) == 0
if fresh then s.q = tonumber(ARGV[8]) end
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
local seq, countdown = 0, 0
if s.sc == 0 or s.sa + grace < now then
  countdown = schedule(s, due, now)
  seq = s.q
end
local extra = {'pl', ARGV[3]}
if fresh then extra = {'pl', ARGV[3], 'k', ARGV[1], 'tn', ARGV[2]} end
save(h, s, now, tonumber(ARGV[7]), grace, extra)
local snap = {}
if opened == 1 or lost > 0 then snap = snapshot(h) end
return {s.f, s.p, fmt(s.d), fmt(seq), fmt(countdown), opened, prev_pl, fmt(prev_lt), fmt(prev_d),
        fmt(now), lost, snap}
