-- Redo a lost run, re-dispatch a flight whose message is overdue.
-- ARGV: now_us (0: Redis TIME), grace_us (overdue after this), ttl_ms, dispatch_grace_us
-- (DEBOUNCE_DISPATCH_GRACE, which the other scripts use; the state is saved with it).
-- Returns {lost_run_id, seq, countdown_us, snapshot}
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0, '0', '0', {}} end
local now = clock()
local grace = tonumber(ARGV[2])
local s = load_state(h)
local lost = recover_lease(h, s, now)
local seq, cd = 0, 0
if s.p > 0 and s.ru == 0 and (s.sc == 0 or s.sa + grace < now) then
  cd = schedule(s, math.max(s.d, now), now)
  seq = s.q
end
save(h, s, now, tonumber(ARGV[3]), tonumber(ARGV[4]) or grace)
return {lost, fmt(seq), fmt(cd), snapshot(h)}
