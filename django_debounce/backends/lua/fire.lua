-- What a dispatch message does. ARGV: now_us (0: Redis TIME), seq (-1: in-process, no
-- fencing), overlap (0/1), lease_us, grace_us, ttl_ms
-- Returns {action, ...}: 0 drop, 1 rearm, 2 wait (maybe a lease watchdog), 3 claim, -1 missing.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {-1} end
local now = clock()
local grace, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local s = load_state(h)
s.o = tonumber(ARGV[3])
local lost = recover_lease(h, s, now)
local seq = tonumber(ARGV[2])
if seq >= 0 and (seq ~= s.q or s.sc == 0) then
  save(h, s, now, ttl, grace)
  return {0, lost}
end
if s.p == 0 then
  s.sc = 0
  save(h, s, now, ttl, grace)
  return {0, lost}
end
if now < s.d then
  local cd = schedule(s, s.d, now)
  save(h, s, now, ttl, grace)
  return {1, lost, fmt(s.q), fmt(cd)}
end
if s.ru > 0 and s.o == 0 then
  -- the finishing run schedules this flight; a watchdog at the lease end covers a dead worker
  s.sc = 0
  s.sa = 0
  local at, cd = watchdog(s, now)
  save(h, s, now, ttl, grace)
  return {2, lost, fmt(at), fmt(cd)}
end
-- claim
local first, last, due, flight, attempt = s.ft, s.lt, s.d, s.f, s.ra
local claimed, rest = s.p, 0
local payload
if s.cl > 0 then
  -- a run takes at most collect_limit items; the rest stay pending as the next flight
  local n = redis.call('ZCARD', KEYS[2])
  local taken = redis.call('ZRANGE', KEYS[2], 0, s.cl - 1, 'WITHSCORES')
  payload = '['
  local args = {}
  for i = 1, #taken, 2 do
    if i > 1 then payload = payload .. ',' end
    payload = payload .. taken[i]
    args[#args + 1] = taken[i + 1]
    args[#args + 1] = taken[i]
  end
  payload = payload .. ']'
  redis.call('DEL', KEYS[3])
  if #args > 0 then redis.call('ZADD', KEYS[3], unpack(args)) end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, s.cl - 1)
  rest = math.max(n - s.cl, 0)
  claimed = s.p - rest
else
  payload = redis.call('HGET', h, 'pl') or ''
end
s.r = s.r + 1
s.ru = now + tonumber(ARGV[4])
s.rt = claimed
s.rf = first
s.rr = attempt
s.R = s.R + 1
s.M = s.M + claimed - 1
s.ra = 0
s.nb = 0
s.sc = 0
s.sa = 0
s.lr = now
local fseq, fcd = 0, 0
if rest > 0 then
  s.f = s.f + 1
  s.p = rest
  if rest >= s.cl then
    s.df = 1
    s.d = now
  else
    s.df = 0
  end
  if s.o == 1 then
    fcd = schedule(s, s.d, now)
    fseq = s.q
  end
else
  s.p = 0
  s.ft = 0
  s.an = 0
  s.d = 0
  s.df = 0
end
local extra = {'pl', '', 'rp', payload}
if s.cl > 0 then extra = {'rp', ''} end
save(h, s, now, ttl, grace, extra)
return {3, lost, fmt(s.r), fmt(flight), claimed, payload, fmt(first), fmt(last), fmt(due), fmt(now),
        snapshot(h), attempt, fmt(fseq), fmt(fcd)}
