-- Take back a trigger whose dispatch message could not be published (I8).
-- ARGV: now_us (0: Redis TIME), seq, opened (0/1), prev_payload, prev_last_us, prev_due_us,
--       grace_us, ttl_ms, kind ('fire': seq is the flight message's; 'watch': seq is the
--       watchdog's time), at_us (the time of the trigger taken back), prev_due_fixed (0/1),
--       added (1: the trigger added its item to a collected flight), item,
--       pending (the flight's pending triggers as the trigger left them), flight (the
--       trigger's flight id; 0: unknown)
-- Returns {1, snapshot} or {0}.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0} end
local now = clock()
local s = load_state(h)
if s.p == 0 then return {0} end
-- the trigger's flight ran meanwhile (a parked lease watchdog outlives its run): the pending
-- triggers are others
local flight = tonumber(ARGV[15]) or 0
if flight > 0 and s.f ~= flight then return {0} end
if ARGV[9] == 'watch' then
  if s.wa ~= tonumber(ARGV[2]) then return {0} end
  s.wa = 0
else
  if s.q ~= tonumber(ARGV[2]) or s.sc == 0 then return {0} end
  s.sc = 0
  s.sa = 0
end
s.p = s.p - 1
s.T = s.T - 1
local extra = nil
local restored = false
if s.p == 0 then
  if ARGV[3] == '1' then s.f = s.f - 1 end
  -- the key's last trigger is the one before (the next trigger's edge uses it)
  s.ft, s.an, s.lt, s.d, s.df = 0, 0, tonumber(ARGV[5]), 0, 0
  extra = {'pl', ''}
  if s.cl > 0 then redis.call('DEL', KEYS[2]) end
elseif s.lt == tonumber(ARGV[10]) and tonumber(ARGV[6]) > 0 then
  -- no trigger came after the one taken back: the flight is as it was before it
  s.lt = tonumber(ARGV[5])
  s.d = tonumber(ARGV[6])
  if s.nb > s.d then s.d = s.nb end  -- a retry's backoff that began since
  s.df = tonumber(ARGV[11])
  restored = true
  if s.cl == 0 then extra = {'pl', ARGV[4]} end
end
-- the item it added goes when no pending trigger can have it too: nothing came after it, nor
-- did a run rejoin the flight (pending as the trigger left it: a retried or lost run's items
-- may include it); or the flight holds one item per pending trigger. Otherwise it stays,
-- rather than lose a trigger that merged meanwhile or came back with a run.
if s.p > 0 and s.cl > 0 and ARGV[12] == '1'
    and ((restored and s.p + 1 == tonumber(ARGV[14]))
         or redis.call('ZCARD', KEYS[2]) == s.p + 1) then
  redis.call('ZREM', KEYS[2], ARGV[13])
end
-- otherwise later triggers merged meanwhile: they keep their payload and due time, and with
-- no message outstanding the next trigger or recovery publishes one for them
save(h, s, now, tonumber(ARGV[8]), tonumber(ARGV[7]), extra)
return {1, snapshot(h)}
