-- Shared by every script of the Redis store (prepended by redis.py).
-- State of one debounce key lives in one hash, KEYS[1] = "debounce:{<key hash>}"; in collect
-- mode KEYS[2] (pending items) and KEYS[3] (items of the live run) are sorted sets in the
-- same hash slot, scored by trigger order. ARGV[1] of every script is the time in integer
-- microseconds, 0 meaning Redis TIME (the override exists for run_due and property tests).
-- Times are written with %d so no precision is lost.
-- 'an' is the open flight's max_wait anchor (see trigger.lua); 'lr' the last claim.
local NUM = {'p','f','ft','lt','d','q','sc','sa','r','ru','rt','rf','T','R','M','C','lr','wa','o',
             'mu','x','df','ra','nb','rr','cl','an'}

local function fmt(v) return string.format('%d', v) end

local function clock()
  local n = tonumber(ARGV[1])
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function load_state(h)
  local v = redis.call('HMGET', h, unpack(NUM))
  local s = {}
  for i, n in ipairs(NUM) do s[n] = tonumber(v[i]) or 0 end
  return s
end

-- Until when a trigger only merges (the hot path of trigger.lua): a flight is open and its
-- dispatch message is outstanding and not overdue, or a live run (no overlap) will schedule
-- it and its lease watchdog is parked. 0: the full path decides (always for a flight whose
-- due time is fixed or held by a retry backoff, and in collect mode).
local function merge_until(s, grace_us)
  if s.p == 0 or s.df == 1 or s.nb > 0 or s.cl > 0 then return 0 end
  if s.ru == 0 then
    if s.sc == 1 then return s.sa + grace_us end
    return 0
  end
  if s.o == 1 then
    if s.sc == 1 then return math.min(s.sa + grace_us, s.ru) end
    return 0
  end
  if s.wa > 0 then return math.min(s.ru, s.wa) end
  return 0
end

-- Write every numeric field and refresh the TTL: never shorter than ttl_ms, never shorter
-- than the state still needs (due time, lease, outstanding message) plus the grace period.
-- `x` keeps the expiry deadline so the hot path refreshes the TTL only when it must.
local function save(h, s, now, ttl_ms, grace_us, extra)
  local horizon = math.max(s.d, s.ru, s.sa, s.wa, s.nb) - now + grace_us
  local ttl = math.max(ttl_ms, math.ceil(horizon / 1000))
  s.mu = merge_until(s, grace_us)
  s.x = now + ttl * 1000
  local args = {}
  for _, n in ipairs(NUM) do args[#args + 1] = n; args[#args + 1] = fmt(s[n]) end
  if extra then for _, x in ipairs(extra) do args[#args + 1] = x end end
  redis.call('HSET', h, unpack(args))
  redis.call('PEXPIRE', h, fmt(ttl))
  if s.cl > 0 then
    redis.call('PEXPIRE', KEYS[2], fmt(ttl))
    redis.call('PEXPIRE', KEYS[3], fmt(ttl))
  end
end

-- The collected items of a set as one JSON array (items are canonical JSON already).
local function items_json(key, first, last)
  return '[' .. table.concat(redis.call('ZRANGE', key, first, last), ',') .. ']'
end

-- The live run's triggers go back to pending (a lost run, or a failed one to retry); its
-- claim is taken out of the totals so I6 counts them once, in the run that covers them.
local function unclaim(h, s, now)
  local claimed = s.rt
  s.R = math.max(s.R - 1, 0)
  s.M = math.max(s.M - math.max(claimed - 1, 0), 0)
  if s.p == 0 then
    s.f = s.f + 1
    s.ft = s.rf
    s.an = s.rf
    if s.lt == 0 then s.lt = s.rf end
    s.d = now
    s.df = 0
    if s.cl == 0 then redis.call('HSET', h, 'pl', redis.call('HGET', h, 'rp') or '') end
  else
    -- newer triggers keep their quiet period (I3); the run's triggers are older; the
    -- earlier max_wait anchor is kept (the run's triggers bring their first trigger time)
    if s.an == 0 then s.an = s.ft end  -- a flight opened before the anchor existed
    s.ft = math.min(s.ft, s.rf)
    s.an = math.min(s.an, s.rf)
  end
  if s.cl > 0 then
    -- the run's items come first: their scores are lower, and MIN keeps the first place
    redis.call('ZUNIONSTORE', KEYS[2], 2, KEYS[2], KEYS[3], 'AGGREGATE', 'MIN')
    redis.call('DEL', KEYS[3])
  end
  s.p = s.p + claimed
  s.ra = math.max(s.ra, s.rr)
  -- a parked watchdog (wa) stays parked: when it arrives it re-arms for the next run
  s.ru = 0
  s.rt = 0
  s.rf = 0
  s.rr = 0
  redis.call('HSET', h, 'rp', '')
end

-- A live run whose lease ran out is lost: its triggers go back to pending (I7).
-- Returns the lost run id, or 0.
local function recover_lease(h, s, now)
  if s.ru == 0 or s.ru > now then return 0 end
  local lost = s.r
  local attempt = s.rr
  unclaim(h, s, now)
  s.ra = math.max(s.ra, attempt + 1)  -- a lost run counts as an attempt
  redis.call('HSET', h, 'lo', 'lost')
  return lost
end

-- Mark a new dispatch message outstanding for time `at`; returns its countdown (us).
local function schedule(s, at, now)
  s.q = s.q + 1
  s.sc = 1
  s.sa = at
  return math.max(at - now, 0)
end

-- At most one lease watchdog per key is parked at a time. Returns its time and countdown
-- (us), or 0, 0 when none is needed.
local function watchdog(s, now)
  if s.ru == 0 or s.wa > now then return 0, 0 end
  s.wa = s.ru
  return s.ru, s.ru - now
end

local function snapshot(h)
  return redis.call('HGETALL', h)
end
