-- End of run ARGV[8]. Twin of DatabaseBackend.finish and KeyModel.finish.
-- ARGV (after the common header): [8] run_id, [9] ok (0/1), [10] retry_us (-1: no retry;
-- else the failed run's triggers run again no earlier than this), [11] error text, [12] give
-- up (1: the flow gave the flight up without running it, its attempts ran out: only the
-- triggers an attempt covered fail; the others go back to pending, due at once).
-- [13] the run's claim time in us (0: not given): only the run claimed then is finished (a
-- key whose state was lost and rebuilt from its durable record may hand out a run id again).
-- Returns {applied (0/1), seq, countdown_us, lost_run_id}.
local c = single_ctx()
local h = c.h
if redis.call('EXISTS', h) == 0 then return {0, '0', '0', 0} end
local now = clock()
local s, o = load_state(h)
local lost = recover_lease(s, now, c)
local extra = nil
local started = tonumber(ARGV[13]) or 0
if s.r ~= tonumber(ARGV[8]) or s.ru == 0 or (started > 0 and s.lr ~= started) then
  -- a late finisher after its lease ran out (or of an earlier run with this id) changes
  -- nothing; when it recovered the lost run itself, it schedules that flight
  local seq, cd = 0, 0
  if lost > 0 and s.p > 0 and s.ru == 0 and s.tk == 0 then
    seq, cd = schedule(s, math.max(s.d, now), now, c)
  end
  save(h, s, o, extra)
  reindex(s, c)
  return {0, fmt(seq), fmt(cd), lost}
end
local run_id = s.r
local outcome = 'failure'
local retry = tonumber(ARGV[10])
if ARGV[9] == '1' then
  outcome = 'success'
elseif retry >= 0 then
  outcome = 'retry'
end
local covered = s.rt
if outcome == 'retry' then
  local attempt = s.rr + 1
  unclaim(s, now, c)
  s.ra = attempt
  s.nb = now + retry
  s.d = math.max(s.d, s.nb)
  s.df = 0
elseif ARGV[12] == '1' and s.rc > 0 and s.rc < run_size(s, c) then
  -- given up: the attempted triggers (first in the run) fail; the others go back to pending
  local back, payload = 0, nil
  if s.cs > 0 then
    redis.call('ZREMRANGEBYRANK', c.run_items, 0, s.rc - 1)
    back = redis.call('ZCARD', c.run_items)
  else
    back = s.rt - s.rc
    payload = redis.call('HGET', h, 'rp')
  end
  covered = s.rt - back
  s.M = math.max(s.M - back, 0)
  local ac, pending = s.ac, s.p
  rejoin(s, now, c, back, payload)
  if pending > 0 then s.ac = ac else s.ac, s.ra = 0, 0 end
  redis.call('DEL', c.run_items)
  end_run(s)
  extra = concat(extra, {'rp', ''})
else
  end_run(s)
  if s.cs > 0 then redis.call('DEL', c.run_items) end
  extra = concat(extra, {'rp', ''})
end
local seq, cd = 0, 0
if s.p > 0 then
  local at = math.max(s.d, now)
  if s.tk == 0 or s.ta > at then seq, cd = schedule(s, at, now, c) end
end
extra = concat(extra, {'lo', outcome})
save(h, s, o, extra)
reindex(s, c)
record(c, 'f', now, s, run_id, outcome .. '|' .. fmt(covered) .. '|' .. ARGV[11])
return {1, fmt(seq), fmt(cd), lost}
