-- Shared by every script of the Redis store (prepended by redis.py).
-- State of one debounce key lives in one hash, KEYS[1] = "debounce:{<key hash>}".
-- Times are integer microseconds from Redis TIME, written with %d so no precision is lost.
local NUM = {'p','f','ft','lt','d','q','sc','sa','r','ru','rt','rf','T','R','M','C','lr','wa','o','mu','x'}

local function fmt(v) return string.format('%d', v) end

local function clock()
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
-- it and its lease watchdog is parked. 0: the full path decides.
local function merge_until(s, grace_us)
  if s.p == 0 then return 0 end
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
  local horizon = math.max(s.d, s.ru, s.sa, s.wa) - now + grace_us
  local ttl = math.max(ttl_ms, math.ceil(horizon / 1000))
  s.mu = merge_until(s, grace_us)
  s.x = now + ttl * 1000
  local args = {}
  for _, n in ipairs(NUM) do args[#args + 1] = n; args[#args + 1] = fmt(s[n]) end
  if extra then for _, x in ipairs(extra) do args[#args + 1] = x end end
  redis.call('HSET', h, unpack(args))
  redis.call('PEXPIRE', h, fmt(ttl))
end

-- A live run whose lease ran out is lost: its triggers go back to pending (I7).
-- Returns the lost run id, or 0.
local function recover_lease(h, s, now)
  if s.ru == 0 or s.ru > now then return 0 end
  local lost = s.r
  local claimed = s.rt
  s.R = math.max(s.R - 1, 0)
  s.M = math.max(s.M - math.max(claimed - 1, 0), 0)
  if s.p == 0 then
    s.f = s.f + 1
    s.ft = s.rf
    s.lt = s.rf
    s.d = now
    redis.call('HSET', h, 'pl', redis.call('HGET', h, 'rp') or '')
  else
    -- newer triggers keep their quiet period (I3); the lost run's triggers are older
    s.ft = math.min(s.ft, s.rf)
  end
  s.p = s.p + claimed
  s.wa = 0
  s.ru = 0
  s.rt = 0
  s.rf = 0
  redis.call('HSET', h, 'rp', '', 'lo', 'lost')
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
