-- trigger: count one trigger. Twin of DatabaseBackend.trigger and KeyModel.trigger.
-- Two parts: a self-contained hot path, then (after the shared functions, which redis.py
-- inserts at the marker) the full state machine.
-- ARGV (after the common header, see common.lua): [8] payload (an item in collect mode),
-- [9] wait_us, [10] max_wait_us (-1: none), [11] edge (0: trailing, 1: leading and
-- trailing, 2: leading only), [12] collect_limit (0: none), [13] short readable key ('':
-- none), [14] seed "run_id,flight_id,triggers,runs,merged,cancelled,pending,first_us,due_us"
-- of the durable record ('': not read yet); pending > 0 when the record holds a flight whose
-- Redis state was lost: this trigger joins it (nothing lost, I1).
-- A key new to Redis returns {'seed', now} without a seed: the caller reads the durable
-- record (and opens it at this step's time, the clock of every record) and calls again, so
-- counters continue where the record left them.
local h = KEYS[1]
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Hot path: a trigger that only joins an open flight (no lost lease to recover, not
-- collecting) reads nine fields, writes five, and replies with one status line of three
-- numbers. It moves the due time later only, so the index entry stays (see common.lua).
if ARGV[12] == '0' and ARGV[14] == '' then
  local m = redis.call('HMGET', h, 'p', 'ru', 'f', 'T', 'd', 'ft', 'an', 'df', 'nb', 'bd')
  local p = tonumber(m[1]) or 0
  local ru = tonumber(m[2]) or 0
  if p > 0 and (ru == 0 or ru > now) then
    local due = tonumber(m[5])
    -- the flight's max_wait bound: the smallest anchor + max_wait among its triggers
    local bd = tonumber(m[10])
    local max_wait = tonumber(ARGV[10])
    local newbd = nil
    if max_wait >= 0 then
      local b = (tonumber(m[7]) or tonumber(m[6])) + max_wait
      if not bd or b < bd then bd = b; newbd = string.format('%d', b) end
    end
    if m[8] ~= '1' then
      local d = now + tonumber(ARGV[9])
      if bd and bd < d then d = bd end
      if d > due then due = d end
    end
    local nb = tonumber(m[9]) or 0
    if nb > due then due = nb end
    local ps = string.format('%d', p + 1)
    local ds = string.format('%d', due)
    if newbd then
      redis.call('HSET', h, 'p', ps, 'T', string.format('%d', tonumber(m[4]) + 1),
                 'lt', string.format('%d', now), 'd', ds, 'pl', ARGV[8], 'bd', newbd)
    else
      redis.call('HSET', h, 'p', ps, 'T', string.format('%d', tonumber(m[4]) + 1),
                 'lt', string.format('%d', now), 'd', ds, 'pl', ARGV[8])
    end
    -- One status reply, "flight pending due": a client parses it in one line read.
    return {ok = m[3] .. ' ' .. ps .. ' ' .. ds}
  end
end

-- @@common@@

local c = single_ctx()
local fresh = redis.call('EXISTS', h) == 0
if fresh and ARGV[14] == '' then return {'seed', fmt(now)} end
if not fresh and ARGV[14] ~= '' then
  -- Triggers of a key new to Redis race: each read the durable record, and one made the
  -- hash first. When that one took the record's flight as lost, the flight it rebuilt
  -- counted every trigger the record had counted before it (field 'sT'), this one too if it
  -- is among them: it must not be counted twice (I6). Its collected item still joins.
  local before = tonumber(string.match(ARGV[14], '^[^,]*,[^,]*,([^,]*)'))
  local through = tonumber(redis.call('HGET', h, 'sT') or '-1')
  if before < through then
    if tonumber(ARGV[12]) > 0 then
      local cs = redis.call('HINCRBY', h, 'cs', 1)
      redis.call('ZADD', c.items, 'NX', cs, ARGV[8])
    end
    local m = redis.call('HMGET', h, 'f', 'p', 'd')
    return {ok = (m[1] or '0') .. ' ' .. (m[2] or '0') .. ' ' .. (m[3] or '0')}
  end
end
local s, o = load_state(h)
local extra = {}
if fresh then
  local seed = {}
  for v in string.gmatch(ARGV[14], '[^,]+') do seed[#seed + 1] = tonumber(v) end
  s.r, s.f, s.T, s.R, s.M, s.C = seed[1], seed[2], seed[3], seed[4], seed[5], seed[6]
  if (seed[7] or 0) > 0 then
    -- the record's flight lost its Redis state: it is this key's open flight again
    s.p = seed[7]
    s.ft = seed[8] > 0 and seed[8] or now
    s.lt, s.an = s.ft, s.ft
    s.d = seed[9] > 0 and seed[9] or now
  end
  if ARGV[13] ~= '' then extra = {'k', ARGV[13]} end
  if (seed[7] or 0) > 0 then
    -- the record's triggers before this one are in the rebuilt flight (see above)
    extra[#extra + 1] = 'sT'
    extra[#extra + 1] = fmt(seed[3])
  end
end
local wait = tonumber(ARGV[9])
local max_wait = tonumber(ARGV[10])
local edge = tonumber(ARGV[11])
local limit = tonumber(ARGV[12])
local overlap = c.overlap
s.o = overlap
local lost = recover_lease(s, now, c)
local opened = 0
if s.p == 0 then
  -- edge semantics as lodash debounce: a leading edge when the last trigger is `wait` or
  -- more ago (timeSinceLastCall) or the last run `max_wait` or more ago (timeSinceLastInvoke)
  local leading = false
  if edge >= 1 then
    if s.lt == 0 or now - s.lt >= wait then
      leading = true
    elseif max_wait >= 0 and (s.lr == 0 or now - s.lr >= max_wait) then
      leading = true
    end
  end
  if not leading and edge == 2 then
    -- trailing=False: inside the window of a leading run, the trigger is dropped
    s.T = s.T + 1
    s.C = s.C + 1
    s.lt = now
    save(h, s, o, extra)
    reindex(s, c)
    return {fmt(s.f), 0, '0', '0', '0', 0, lost, fmt(s.T), fmt(s.R), fmt(s.M), fmt(s.C),
            fmt(s.r), fmt(now)}
  end
  -- max_wait counts from lodash's lastInvokeTime: the last run's claim while the stream goes
  -- on (the last trigger within `wait`, the claim within `max_wait`), else this trigger
  local anchor = now
  if max_wait >= 0 and s.lt > 0 and now - s.lt < wait and s.lr > 0 and now - s.lr < max_wait then
    anchor = s.lr
  end
  s.f = s.f + 1
  s.ft = now
  s.an = anchor
  s.bd = 0
  s.df = leading and 1 or 0
  s.ra = 0
  s.ac = 0
  s.nb = 0
  s.tk, s.ta = 0, 0
  opened = 1
end
s.p = s.p + 1
s.T = s.T + 1
s.lt = now
local full = false
if limit > 0 then
  -- scores keep the trigger order, from a counter of their own ('cs') that only grows
  s.cs = s.cs + 1
  redis.call('ZADD', c.items, 'NX', s.cs, ARGV[8])
  full = redis.call('ZCARD', c.items) >= limit
else
  extra[#extra + 1] = 'pl'
  extra[#extra + 1] = ARGV[8]
end
-- the flight's max_wait bound: the smallest anchor + max_wait among its triggers
if max_wait >= 0 and (s.bd == 0 or s.an + max_wait < s.bd) then s.bd = s.an + max_wait end
local due
if s.df == 1 and opened == 0 then
  due = s.d  -- a leading or full flight is not delayed by later triggers
elseif s.df == 1 or full then
  due = now
else
  due = now + wait
  if s.bd > 0 then due = math.min(due, s.bd) end
  -- never earlier than the due time given to the flight's earlier triggers (I3): a lost or
  -- retried run that rejoined it brought an older first trigger
  if opened == 0 and s.d > 0 then due = math.max(due, s.d) end
end
if full then s.df = 1 end
if s.nb > 0 and due < s.nb then due = s.nb end  -- a retry's backoff: triggers join the retry
s.d = due
local seq, countdown = 0, 0
if s.ru > 0 and overlap == 0 then
  -- the finishing run schedules the flight; the live run's lease end is in the index
elseif s.tk == 0 or s.ta > due then
  seq, countdown = schedule(s, due, now, c)
end
save(h, s, o, extra)
reindex(s, c)
return {fmt(s.f), s.p, fmt(s.d), fmt(seq), fmt(countdown), opened, lost, fmt(s.T), fmt(s.R),
        fmt(s.M), fmt(s.C), fmt(s.r), fmt(now)}
