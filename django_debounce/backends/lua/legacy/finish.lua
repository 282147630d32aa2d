-- End of run ARGV[2]. ARGV: now_us (0: Redis TIME), run_id, ok (0/1), grace_us, ttl_ms,
-- retry_us (-1: no retry; else the failed run's triggers run again no earlier than this)
-- Returns {applied (0/1), seq, countdown_us, now_us, snapshot, lost_run_id}
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0, '0', '0', '0', {}, 0} end
local now = clock()
local grace, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local s = load_state(h)
local lost = recover_lease(h, s, now)
if s.r ~= tonumber(ARGV[2]) or s.ru == 0 then
  -- a late finisher after its lease ran out changes nothing; the flight its lost run went
  -- back to (recovered just now) gets its message
  local snap = {}
  local seq, cd = 0, 0
  if lost > 0 then
    if s.p > 0 and s.ru == 0 and s.sc == 0 then
      cd = schedule(s, math.max(s.d, now), now)
      seq = s.q
    end
    save(h, s, now, ttl, grace)
    snap = snapshot(h)
  end
  return {0, fmt(seq), fmt(cd), fmt(now), snap, lost}
end
local outcome = 'failure'
local retry = tonumber(ARGV[6])
if ARGV[3] == '1' then
  outcome = 'success'
elseif retry >= 0 then
  outcome = 'retry'
end
if outcome == 'retry' then
  local attempt = s.rr + 1
  unclaim(h, s, now)
  s.ra = attempt
  s.nb = now + retry
  s.d = math.max(s.d, s.nb)
  s.df = 0
else
  s.ru = 0
  s.rt = 0
  s.rf = 0
  s.rr = 0
  if s.cl > 0 then redis.call('DEL', KEYS[3]) end
end
local seq, cd = 0, 0
if s.p > 0 then
  local at = math.max(s.d, now)
  if s.sc == 0 or s.sa > at then
    cd = schedule(s, at, now)
    seq = s.q
  end
end
save(h, s, now, ttl, grace, {'rp', '', 'lo', outcome})
return {1, fmt(seq), fmt(cd), fmt(now), snapshot(h), 0}
