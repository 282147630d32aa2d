-- Take back a trigger whose dispatch message could not be published (I8).
-- ARGV: seq, opened (0/1), prev_payload, prev_last_us, prev_due_us, grace_us, ttl_ms,
--       kind ('fire': seq is the flight message's; 'watch': seq is the watchdog's time),
--       at_us (the time of the trigger taken back). Returns {1, snapshot} or {0}.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0} end
local now = clock()
local s = load_state(h)
if s.p == 0 then return {0} end
if ARGV[8] == 'watch' then
  if s.wa ~= tonumber(ARGV[1]) then return {0} end
  s.wa = 0
else
  if s.q ~= tonumber(ARGV[1]) or s.sc == 0 then return {0} end
  s.sc = 0
  s.sa = 0
end
s.p = s.p - 1
s.T = s.T - 1
local extra = nil
if s.p == 0 then
  if ARGV[2] == '1' then s.f = s.f - 1 end
  s.ft, s.lt, s.d = 0, 0, 0
  extra = {'pl', ''}
elseif s.lt == tonumber(ARGV[9]) and tonumber(ARGV[5]) > 0 then
  -- no trigger came after the one taken back: the flight is as it was before it
  s.lt = tonumber(ARGV[4])
  s.d = tonumber(ARGV[5])
  extra = {'pl', ARGV[3]}
end
-- otherwise later triggers merged meanwhile: they keep their payload and due time, and with
-- no message outstanding the next trigger or recovery publishes one for them
save(h, s, now, tonumber(ARGV[7]), tonumber(ARGV[6]), extra)
return {1, snapshot(h)}
