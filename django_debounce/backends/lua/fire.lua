-- What a dispatch message does. ARGV: seq (-1: in-process, no fencing), overlap (0/1),
-- lease_us, now_us (0: Redis TIME), grace_us, ttl_ms
-- Returns {action, ...}: 0 drop, 1 rearm, 2 wait (maybe a lease watchdog), 3 claim, -1 missing.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {-1} end
local now = tonumber(ARGV[4])
if now == 0 then now = clock() end
local grace, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local s = load_state(h)
s.o = tonumber(ARGV[2])
local lost = recover_lease(h, s, now)
local seq = tonumber(ARGV[1])
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
if s.ru > 0 and ARGV[2] == '0' then
  -- the finishing run schedules this flight; a watchdog at the lease end covers a dead worker
  s.sc = 0
  s.sa = 0
  local at, cd = watchdog(s, now)
  save(h, s, now, ttl, grace)
  return {2, lost, fmt(at), fmt(cd)}
end
-- claim
local payload = redis.call('HGET', h, 'pl') or ''
local first, last, due, claimed = s.ft, s.lt, s.d, s.p
s.r = s.r + 1
s.ru = now + tonumber(ARGV[3])
s.rt = claimed
s.rf = first
s.R = s.R + 1
s.M = s.M + claimed - 1
s.p = 0
s.ft = 0
s.d = 0
s.sc = 0
s.sa = 0
s.lr = now
save(h, s, now, ttl, grace, {'pl', '', 'rp', payload})
return {3, lost, fmt(s.r), fmt(s.f), claimed, payload, fmt(first), fmt(last), fmt(due), fmt(now),
        snapshot(h)}
