-- End of run ARGV[1]. ARGV: run_id, ok (0/1), grace_us, ttl_ms
-- Returns {applied (0/1), seq, countdown_us, now_us, snapshot}
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0, '0', '0', '0', {}} end
local now = clock()
local grace, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local s = load_state(h)
if s.r ~= tonumber(ARGV[1]) or s.ru == 0 then
  return {0, '0', '0', fmt(now), {}}  -- a late finisher after its lease ran out changes nothing
end
s.ru = 0
s.rt = 0
s.rf = 0
local outcome = 'failure'
if ARGV[2] == '1' then outcome = 'success' end
local seq, cd = 0, 0
if s.p > 0 then
  local at = math.max(s.d, now)
  if s.sc == 0 or s.sa > at then
    cd = schedule(s, at, now)
    seq = s.q
  end
end
save(h, s, now, ttl, grace, {'rp', '', 'lo', outcome})
return {1, fmt(seq), fmt(cd), fmt(now), snapshot(h)}
