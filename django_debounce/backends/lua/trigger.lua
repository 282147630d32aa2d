-- trigger: count one trigger. Two parts: a self-contained hot path, then (after the shared
-- functions, which redis.py inserts at the marker) the full state machine.
-- ARGV: now_us (0: Redis TIME), payload (an item in collect mode), wait_us,
--       max_wait_us (-1: none), grace_us, ttl_ms, overlap (0/1),
--       edge (0: trailing, 1: leading and trailing, 2: leading only), collect_limit (0: none),
--       and only when the key is new to Redis: key, task_name, seq_base,
--       seed ("run_id,flight_id,triggers,runs,merged,cancelled" of the durable record).
-- A key new to Redis returns {'seed'} when the seed is missing: the caller reads the durable
-- record and calls again, so counters continue where the database left them.
local h = KEYS[1]
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local grace = tonumber(ARGV[5])

-- Hot path: a trigger that only merges into an open flight (see merge_until) reads eight
-- fields, writes five, and replies with one status line of three numbers. A flight that
-- this trigger makes due before its outstanding message (max_wait from an early anchor)
-- takes the full path, which publishes a message for the earlier time; so does a flight
-- opened before the anchor field existed (an = 0), which the full path gives one.
local m = redis.call('HMGET', h, 'mu', 'p', 'an', 'T', 'f', 'x', 'sa', 'd')
local hot, due = (tonumber(m[1]) or 0) > now and (tonumber(m[3]) or 0) > 0, 0
if hot then
  due = now + tonumber(ARGV[3])
  local max_wait = tonumber(ARGV[4])
  if max_wait >= 0 then due = math.min(due, tonumber(m[3]) + max_wait) end
  due = math.max(due, tonumber(m[8]) or 0)  -- never earlier than the flight's due (I3)
  hot = due >= (tonumber(m[7]) or 0)
end
if hot then
  local ps = string.format('%d', tonumber(m[2]) + 1)
  local ds = string.format('%d', due)
  local ttl_ms = tonumber(ARGV[6])
  local x = tonumber(m[6]) or 0
  if due + grace > x or x - now < ttl_ms * 500 then
    local ttl = math.max(ttl_ms, math.ceil((due + grace - now) / 1000))
    redis.call('HSET', h, 'p', ps, 'T', string.format('%d', tonumber(m[4]) + 1),
               'lt', string.format('%d', now), 'd', ds, 'pl', ARGV[2],
               'x', string.format('%d', now + ttl * 1000))
    redis.call('PEXPIRE', h, string.format('%d', ttl))
  else
    redis.call('HSET', h, 'p', ps, 'T', string.format('%d', tonumber(m[4]) + 1),
               'lt', string.format('%d', now), 'd', ds, 'pl', ARGV[2])
  end
  -- One status reply, "flight pending due": a client parses it in one line read.
  return {ok = m[5] .. ' ' .. ps .. ' ' .. ds}
end

-- @@common@@

local fresh = m[5] == false
if fresh and ARGV[13] == nil then return {'seed'} end
local s = load_state(h)
local extra = {}
if fresh then
  s.q = tonumber(ARGV[12])
  local i = 0
  for v in string.gmatch(ARGV[13], '[^,]+') do
    i = i + 1
    local n = tonumber(v)
    if i == 1 then s.r = n elseif i == 2 then s.f = n elseif i == 3 then s.T = n
    elseif i == 4 then s.R = n elseif i == 5 then s.M = n elseif i == 6 then s.C = n end
  end
  extra = {'k', ARGV[10], 'tn', ARGV[11]}
end
local ttl_ms = tonumber(ARGV[6])
local wait = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local edge = tonumber(ARGV[8])
s.cl = tonumber(ARGV[9])
s.o = tonumber(ARGV[7])
if s.p > 0 and s.an == 0 then s.an = s.ft end  -- a flight opened before the anchor existed
local lost = recover_lease(h, s, now)
local prev_pl = redis.call('HGET', h, 'pl') or ''
local prev_lt, prev_d, prev_df = s.lt, s.d, s.df
local opened = 0
if s.p == 0 then
  -- edge semantics as lodash debounce: the trigger continues the stream (lodash's
  -- shouldInvoke is false) when the key's last trigger is less than `wait` ago
  -- (timeSinceLastCall; cancel clears it) and, with max_wait, the last run was claimed less
  -- than `max_wait` ago (timeSinceLastInvoke); otherwise it starts a new burst (leadingEdge):
  -- a leading edge with `leading`
  local continues = s.lt > 0 and now - s.lt < wait
  if continues and max_wait >= 0 then continues = s.lr > 0 and now - s.lr < max_wait end
  local leading = edge >= 1 and not continues
  if not leading and edge == 2 then
    -- trailing=False: inside the window of a leading run, the trigger is dropped
    s.T = s.T + 1
    s.C = s.C + 1
    s.lt = now
    save(h, s, now, ttl_ms, grace, extra)
    local snap = {}
    if fresh or lost > 0 then snap = snapshot(h) end
    return {s.f, 0, '0', '0', '0', 0, '', '0', '0', fmt(now), lost, snap, '', 0, 0}
  end
  s.f = s.f + 1
  s.ft = now
  -- the max_wait anchor: the last claim while the stream goes on (lodash's lastInvokeTime),
  -- else this trigger (lodash's leadingEdge resets lastInvokeTime to the call)
  if continues and max_wait >= 0 then s.an = s.lr else s.an = now end
  s.df = leading and 1 or 0
  s.ra = 0
  s.nb = 0
  opened = 1
end
s.p = s.p + 1
s.T = s.T + 1
s.lt = now
local full, added = false, 0
if s.cl > 0 then
  -- scores keep the trigger order; T goes back when a trigger is taken back (abort), so
  -- they come from a counter of their own ('cs'), which only grows
  local score = math.max(s.T, (tonumber(redis.call('HGET', h, 'cs')) or 0) + 1)
  redis.call('HSET', h, 'cs', fmt(score))
  added = redis.call('ZADD', KEYS[2], 'NX', score, ARGV[2])
  full = redis.call('ZCARD', KEYS[2]) >= s.cl
else
  extra[#extra + 1] = 'pl'
  extra[#extra + 1] = ARGV[2]
end
local due
if s.df == 1 and opened == 0 then
  due = s.d  -- a leading or full flight is not delayed by later triggers
elseif s.df == 1 or full then
  due = now
else
  due = now + wait
  if max_wait >= 0 then due = math.min(due, s.an + max_wait) end
  -- never earlier than the due time given to the flight's earlier triggers (I3): a lost or
  -- retried run that rejoined it brought an older anchor
  if opened == 0 and s.d > 0 then due = math.max(due, s.d) end
end
if full then s.df = 1 end
if s.nb > 0 and due < s.nb then due = s.nb end  -- a retry's backoff: triggers join the retry
s.d = due
local seq, countdown, kind = 0, 0, ''
if s.ru > 0 and s.o == 0 then
  -- the finishing run schedules this flight; at most a lease watchdog is published
  local at, cd = watchdog(s, now)
  if at > 0 then seq, countdown, kind = at, cd, 'watch' end
elseif s.sc == 0 or s.sa + grace < now or s.sa > due then
  countdown = schedule(s, due, now)
  seq = s.q
  kind = 'fire'
end
save(h, s, now, ttl_ms, grace, extra)
local snap = {}
if opened == 1 or lost > 0 then snap = snapshot(h) end
return {s.f, s.p, fmt(s.d), fmt(seq), fmt(countdown), opened, prev_pl, fmt(prev_lt), fmt(prev_d),
        fmt(now), lost, snap, kind, prev_df, added}
