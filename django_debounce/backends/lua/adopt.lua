-- Adopt the flight of a key that the previous release keeps in its own layout (one hash
-- "debounce:{<key hash>}", one countdown message per flight) into this layout and its due
-- index, after an upgrade. Standalone Redis only (the previous release had no cluster
-- support, and the two layouts are in different slots). Twin of nothing: a one-release shim.
-- ARGV (after the common header): [8] the legacy hash's name.
-- The legacy hash is left as a tombstone (nothing pending, no message out), so a worker of
-- the previous release drops every message of that flight, and one of its web processes
-- that triggers the key again opens a new legacy flight, adopted in turn.
-- Returns 1 adopted, 0 nothing to adopt, -1 a legacy run is live (its lease watchdog or the
-- durable record's recheck adopts the flight after it).
local c = single_ctx()
local h = c.h
local L = ARGV[8]
if redis.call('EXISTS', L) == 0 then return 0 end
local now = clock()
local F = {'p','f','ft','lt','d','q','sc','ru','r','T','R','M','C','lr','df','ra','nb','cl','rt',
           'rf'}
local v = redis.call('HMGET', L, unpack(F))
local l = {}
for i, n in ipairs(F) do l[n] = tonumber(v[i]) or 0 end
if l.ru > now then return -1 end
local lpl = redis.call('HGET', L, 'pl') or ''
local lost = 0
if l.ru > 0 then
  -- its live run's lease ran out: that run is lost, its triggers are pending again
  lost = 1
  if l.p == 0 then
    lpl = redis.call('HGET', L, 'rp') or ''
    l.ft = l.rf
    l.lt = math.max(l.lt, l.rf)
    l.d = now
  else
    l.ft = math.min(l.ft, l.rf)
  end
  l.p = l.p + l.rt
end
if l.p == 0 then return 0 end
local fresh = redis.call('EXISTS', h) == 0
local s, o = load_state(h)
local extra = {}
if fresh then
  s.r, s.f, s.T, s.R, s.M, s.C, s.lr = l.r, l.f, l.T, l.R, l.M, l.C, l.lr
  if lost == 1 then
    s.R = math.max(s.R - 1, 0)
    s.M = math.max(s.M - math.max(l.rt - 1, 0), 0)
  end
  local k = redis.call('HGET', L, 'k')
  if k and #k <= 40 then extra = {'k', k} end
end
if s.p == 0 then
  if not fresh then s.f = s.f + 1 end
  s.ft = l.ft
  s.lt = l.lt
  s.an = l.ft
  s.d = l.d
  s.df = l.df
  s.ra = l.ra
  s.nb = l.nb
  if l.cl == 0 then extra[#extra + 1] = 'pl'; extra[#extra + 1] = lpl end
else
  s.ft = math.min(s.ft, l.ft)
  s.an = math.min(s.an, l.ft)
  if l.lt > s.lt then
    s.lt = l.lt
    if l.cl == 0 then extra[#extra + 1] = 'pl'; extra[#extra + 1] = lpl end
  end
  s.d = math.max(s.d, l.d)
end
if not fresh then s.T = s.T + l.p end
s.p = s.p + l.p
if s.d <= 0 then s.d = now end
if l.cl > 0 then
  -- collected items keep their order after the ones this layout already has
  local items = redis.call('ZRANGE', L .. ':c', 0, -1)
  for _, item in ipairs(items) do
    s.cs = s.cs + 1
    redis.call('ZADD', c.items, 'NX', s.cs, item)
  end
  redis.call('DEL', L .. ':c')
end
s.tk, s.ta = 0, 0
s.o = c.overlap
save(h, s, o, extra)
reindex(s, c)
-- the tombstone: nothing pending, no message out (the previous release's fire drops every
-- message of it; its trigger opens a new flight there, adopted in turn)
redis.call('HSET', L, 'p', '0', 'sc', '0', 'sa', '0', 'mu', '0', 'ft', '0', 'd', '0', 'pl', '',
           'ru', '0', 'rt', '0', 'wa', '0')
return 1
