-- What a dispatch message does. Twin of DatabaseBackend.fire and KeyModel.fire.
-- ARGV (after the common header): [8] seq (-1: in-process, no fencing), [9] lease_us,
-- [10] collect_limit (0: none), [11] collect_bytes (0: none; a run's items stop before the
-- one that would pass it, never fewer than one).
-- Returns {action, lost, ...}: 0 drop, 1 rearm (seq, countdown), 2 wait, -1 missing, and
-- 3 claim: {3, lost, run_id, flight_id, claimed, payload, first, last, due, now, attempt,
-- follow_seq, follow_countdown, short_key, attempted}.
local c = single_ctx()
local h = c.h
if redis.call('EXISTS', h) == 0 then return {-1, 0} end
local now = clock()
local s, o = load_state(h)
local lost = recover_lease(s, now, c)
local extra = nil
local seq = tonumber(ARGV[8])
local overlap = c.overlap
s.o = overlap
if seq >= 0 and (seq ~= s.q or s.tk == 0) then
  save(h, s, o, extra)
  reindex(s, c)
  return {0, lost}
end
if s.p == 0 then
  s.tk, s.ta = 0, 0
  save(h, s, o, extra)
  reindex(s, c)
  return {0, lost}
end
if now < s.d then
  -- early (the flight moved later after its message went out): back to the index, or out
  -- again at once when due within `direct`
  local q, cd = schedule(s, s.d, now, c)
  save(h, s, o, extra)
  reindex(s, c)
  return {1, lost, fmt(q), fmt(cd)}
end
if s.ru > 0 and overlap == 0 then
  -- the finishing run schedules this flight; the live run's lease end is in the index
  s.tk, s.ta = 0, 0
  save(h, s, o, extra)
  reindex(s, c)
  return {2, lost}
end
-- claim
local limit = tonumber(ARGV[10])
local budget = tonumber(ARGV[11])
local first, last, due, flight, attempt, anchor = s.ft, s.lt, s.d, s.f, s.ra, s.an
local claimed, rest = s.p, 0
local payload
local cut = false
if limit > 0 then
  -- a run takes at most collect_limit items, and at most `budget` bytes of them (never
  -- fewer than one); the rest stay pending as the next flight
  local n = redis.call('ZCARD', c.items)
  local taken = redis.call('ZRANGE', c.items, 0, limit - 1, 'WITHSCORES')
  local parts, args, used = {}, {}, 0
  for i = 1, #taken, 2 do
    if budget > 0 and #parts > 0 and used + #taken[i] > budget then
      cut = true
      break
    end
    used = used + #taken[i]
    parts[#parts + 1] = taken[i]
    args[#args + 1] = taken[i + 1]
    args[#args + 1] = taken[i]
  end
  payload = '[' .. table.concat(parts, ',') .. ']'
  redis.call('DEL', c.run_items)
  if #args > 0 then
    redis.call('ZADD', c.run_items, unpack(args))
    redis.call('ZREMRANGEBYRANK', c.items, 0, #parts - 1)
  end
  rest = n - #parts
  claimed = s.p - rest
else
  payload = redis.call('HGET', h, 'pl') or ''
end
s.r = s.r + 1
s.ru = now + tonumber(ARGV[9])
s.rs = math.max(seq, 0)
s.rt = claimed
s.rf = first
s.rn = anchor
s.rb = s.bd
s.rr = attempt
-- the attempted triggers (collect: items) come first, so the run takes them first
local size = claimed
if limit > 0 then size = redis.call('ZCARD', c.run_items) end
s.rc = math.min(s.ac, size)
s.ac = s.ac - s.rc
s.R = s.R + 1
s.M = s.M + claimed - 1
s.ra = 0
s.nb = 0
s.tk, s.ta = 0, 0
s.lr = now
local fseq, fcd = 0, 0
if rest > 0 then
  s.f = s.f + 1
  s.p = rest
  if rest >= limit or cut then
    s.df = 1
    s.d = now
  else
    s.df = 0
  end
  if overlap == 1 then fseq, fcd = schedule(s, s.d, now, c) end
else
  s.p = 0
  s.ft, s.an, s.bd, s.d, s.df, s.ac = 0, 0, 0, 0, 0, 0
end
if limit == 0 then extra = concat(extra, {'rp', payload, 'pl', ''}) end
save(h, s, o, extra)
reindex(s, c)
record(c, 'c', now, s, s.r, table.concat({fmt(flight), fmt(claimed), fmt(first),
  fmt(last), fmt(due), fmt(attempt)}, ','))
return {3, lost, fmt(s.r), fmt(flight), claimed, payload, fmt(first), fmt(last), fmt(due),
        fmt(now), attempt, fmt(fseq), fmt(fcd), redis.call('HGET', h, 'k') or '', s.rc}
