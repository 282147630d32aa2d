-- A lease watchdog arrived. ARGV: now_us (0: Redis TIME), at_us (the lease end it watches),
-- grace_us, ttl_ms. Returns {seq, countdown_us, kind ('fire', 'watch' or ''), lost_run_id,
-- snapshot}
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {'0', '0', '', 0, {}} end
local now = clock()
local grace, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local s = load_state(h)
local lost = recover_lease(h, s, now)
local current = s.wa == 0 or s.wa == tonumber(ARGV[2]) or s.wa <= now
local seq, cd, kind = 0, 0, ''
if s.ru > 0 then
  if current then
    s.wa = 0
    local at, c = watchdog(s, now)
    if at > 0 then seq, cd, kind = at, c, 'watch' end
  end
else
  if current then s.wa = 0 end
  if s.p > 0 and s.sc == 0 then
    cd = schedule(s, math.max(s.d, now), now)
    seq = s.q
    kind = 'fire'
  end
end
save(h, s, now, ttl, grace)
local snap = {}
if lost > 0 or kind == 'fire' then snap = snapshot(h) end
return {fmt(seq), fmt(cd), kind, lost, snap}
