-- Take back a trigger whose dispatch message could not be published (I8).
-- ARGV: seq, opened (0/1), prev_payload, prev_last_us, prev_due_us, grace_us, ttl_ms,
--       kind ('fire': seq is the flight message's; 'watch': seq is the watchdog's time)
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return 0 end
local now = clock()
local s = load_state(h)
if s.p == 0 then return 0 end
if ARGV[8] == 'watch' then
  if s.wa ~= tonumber(ARGV[1]) then return 0 end
  s.wa = 0
else
  if s.q ~= tonumber(ARGV[1]) or s.sc == 0 then return 0 end
  s.sc = 0
  s.sa = 0
end
s.p = s.p - 1
s.T = s.T - 1
local pl = ARGV[3]
if s.p == 0 then
  if ARGV[2] == '1' then s.f = s.f - 1 end
  s.ft, s.lt, s.d = 0, 0, 0
  pl = ''
else
  s.lt = tonumber(ARGV[4])
  s.d = tonumber(ARGV[5])
end
save(h, s, now, tonumber(ARGV[7]), tonumber(ARGV[6]), {'pl', pl})
return 1
