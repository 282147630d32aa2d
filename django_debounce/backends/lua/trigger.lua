-- trigger: count one trigger. Two parts: a self-contained hot path, then (after the shared
-- functions, which redis.py inserts at the marker) the full state machine.
-- ARGV: payload, wait_us, max_wait_us (-1: none), grace_us, ttl_ms, overlap (0/1),
--       and only when the key is new to Redis: key, task_name, seq_base,
--       seed ("run_id,flight_id,triggers,runs,merged,cancelled" of the durable record).
-- A key new to Redis returns {'seed'} when the seed is missing: the caller reads the durable
-- record and calls again, so counters continue where the database left them.
local h = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local grace = tonumber(ARGV[4])

-- Hot path: a trigger that only merges into an open flight (see merge_until) reads six
-- fields, writes five, and replies with three numbers.
local m = redis.call('HMGET', h, 'mu', 'p', 'ft', 'T', 'f', 'x')
if (tonumber(m[1]) or 0) > now then
  local p = tonumber(m[2]) + 1
  local due = now + tonumber(ARGV[2])
  local max_wait = tonumber(ARGV[3])
  if max_wait >= 0 then due = math.min(due, tonumber(m[3]) + max_wait) end
  local ttl_ms = tonumber(ARGV[5])
  local x = tonumber(m[6]) or 0
  if due + grace > x or x - now < ttl_ms * 500 then
    local ttl = math.max(ttl_ms, math.ceil((due + grace - now) / 1000))
    redis.call('HSET', h, 'p', string.format('%d', p), 'T', string.format('%d', tonumber(m[4]) + 1),
               'lt', string.format('%d', now), 'd', string.format('%d', due), 'pl', ARGV[1],
               'x', string.format('%d', now + ttl * 1000))
    redis.call('PEXPIRE', h, string.format('%d', ttl))
  else
    redis.call('HSET', h, 'p', string.format('%d', p), 'T', string.format('%d', tonumber(m[4]) + 1),
               'lt', string.format('%d', now), 'd', string.format('%d', due), 'pl', ARGV[1])
  end
  return {tonumber(m[5]), p, string.format('%d', due)}
end

-- @@common@@

local fresh = m[5] == false
if fresh and ARGV[10] == nil then return {'seed'} end
local s = load_state(h)
if fresh then
  s.q = tonumber(ARGV[9])
  local i = 0
  for v in string.gmatch(ARGV[10], '[^,]+') do
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
local due = now + tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
if max_wait >= 0 then due = math.min(due, s.ft + max_wait) end
s.d = due
local seq, countdown, kind = 0, 0, ''
s.o = tonumber(ARGV[6])
if s.ru > 0 and s.o == 0 then
  -- the finishing run schedules this flight; at most a lease watchdog is published
  local at, cd = watchdog(s, now)
  if at > 0 then seq, countdown, kind = at, cd, 'watch' end
elseif s.sc == 0 or s.sa + grace < now then
  countdown = schedule(s, due, now)
  seq = s.q
  kind = 'fire'
end
local extra = {'pl', ARGV[1]}
if fresh then extra = {'pl', ARGV[1], 'k', ARGV[7], 'tn', ARGV[8]} end
save(h, s, now, tonumber(ARGV[5]), grace, extra)
local snap = {}
if opened == 1 or lost > 0 then snap = snapshot(h) end
return {s.f, s.p, fmt(s.d), fmt(seq), fmt(countdown), opened, prev_pl, fmt(prev_lt), fmt(prev_d),
        fmt(now), lost, snap, kind}
