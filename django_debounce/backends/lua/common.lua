-- Shared by the scripts of the Redis store (prepended by redis.py, or placed at the marker
-- "@@common@@"). Twin of the Python rules in backends/database.py and of django_debounce/machine.py;
-- docs/design.md ("The Redis layout") has the field legend.
--
-- Layout, every key of one debounce key under its shard's hash tag (one Redis Cluster slot):
--   <prefix>{<shard>}:<id>          hash: the key's state (fields below; zero fields absent)
--   <prefix>{<shard>}:<id>:c / :r   sorted sets: collected items pending / of the live run
--   <prefix>{<shard>}:due:<task>    sorted set: the due index of one task (member <id>,
--                                   score: when the key next needs attention, in us)
--   <prefix>{<shard>}:next:<task>   string: a lower bound of that index's first score
--   <prefix>{<shard>}:rec           list: records for the durable mirror (recorder.py)
-- <id> is the key hash (SHA-256) in unpadded base64url: 43 characters.
--
-- The single-key scripts get KEYS[1], the state hash (the other keys they touch are named
-- from it: same hash tag, same slot), and ARGV: [1] now in us (0: Redis TIME), [2] id,
-- [3] overlap (0/1), [4] retake in us (DEBOUNCE_DISPATCH_GRACE), [5] direct in us
-- (DEBOUNCE_PUMP_INTERVAL), [6] idle TTL in ms, [7] task name.
-- Times are integer microseconds, written with %d so no precision is lost.

local NUM = {'p','f','ft','lt','an','bd','d','T','q','tk','ta','r','ru','rs','rt','rf','rn','rb',
             'rr','rc','R','M','C','lr','df','ra','ac','nb','cs','o'}

local function fmt(v) return string.format('%d', v) end

local function clock()
  local n = tonumber(ARGV[1])
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The state of hash h: every numeric field (0 when absent), and the stored values to diff
-- against. While a flight is open, an absent `lt` (last trigger) or `an` (max_wait anchor)
-- is its first trigger: a flight of one trigger keeps two fields fewer.
local function load_state(h)
  local v = redis.call('HMGET', h, unpack(NUM))
  local s, o = {}, {}
  for i, n in ipairs(NUM) do
    local x = tonumber(v[i]) or 0
    s[n] = x
    o[n] = x
  end
  if s.p > 0 then
    if s.lt == 0 then s.lt = s.ft end
    if s.an == 0 then s.an = s.ft end
  end
  return s, o
end

-- Write the fields that changed (zero ones are deleted); `extra`: string fields to set, ''
-- to delete.
local function save(h, s, o, extra)
  local set, del = {}, {}
  for _, n in ipairs(NUM) do
    local v = s[n]
    if (n == 'lt' or n == 'an') and s.p > 0 and v == s.ft then v = 0 end
    if v ~= o[n] then
      if v == 0 then del[#del + 1] = n else set[#set + 1] = n; set[#set + 1] = fmt(v) end
    end
  end
  if extra then
    -- a later value of a field wins
    local last, order = {}, {}
    for i = 1, #extra, 2 do
      if last[extra[i]] == nil then order[#order + 1] = extra[i] end
      last[extra[i]] = extra[i + 1]
    end
    for _, n in ipairs(order) do
      if last[n] == '' then del[#del + 1] = n else set[#set + 1] = n; set[#set + 1] = last[n] end
    end
  end
  if #set > 0 then redis.call('HSET', h, unpack(set)) end
  if #del > 0 then redis.call('HDEL', h, unpack(del)) end
end

-- The context of one key: its Redis keys (h: the state hash; due, next, rec of its shard and
-- task; items, run_items: collected items), its id, its task's name and options.
local function key_ctx(h, id, task, overlap, retake, direct, idle_ttl)
  local base = string.sub(h, 1, #h - #id)
  return {h = h, id = id, task = task, due = base .. 'due:' .. task,
          next = base .. 'next:' .. task, rec = base .. 'rec', items = h .. ':c',
          run_items = h .. ':r', overlap = tonumber(overlap), retake = tonumber(retake),
          direct = tonumber(direct), idle_ttl = idle_ttl}
end

-- The context of a single-key script (see the ARGV header above).
local function single_ctx()
  return key_ctx(KEYS[1], ARGV[2], ARGV[7], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
end

-- When the key next needs attention (its index entry), or nil: a live run's lease end; an
-- open flight's due time, or, when its message is out (`tk`), when that message counts as lost.
local function attention(s, c)
  local t = nil
  if s.ru > 0 then t = s.ru end
  if s.p > 0 and (s.ru == 0 or s.o == 1) then
    local x = s.d
    if s.tk == 1 then x = s.ta + c.retake end
    if t == nil or x < t then t = x end
  end
  return t
end

-- Put the key's index entry at its attention time (or remove it), keep the index's `next`
-- a lower bound of its first score, and give an idle key a TTL (a live one has none: the
-- index and the durable record find it).
local function reindex(s, c)
  local t = attention(s, c)
  if t then
    redis.call('ZADD', c.due, t, c.id)
    local n = tonumber(redis.call('GET', c.next))
    if not n or t < n then redis.call('SET', c.next, fmt(t)) end
    redis.call('PERSIST', c.h)
  else
    redis.call('ZREM', c.due, c.id)
    if s.ru == 0 and s.p == 0 then redis.call('PEXPIRE', c.h, c.idle_ttl) end
  end
end

-- The next dispatch sequence: time-based, so a key dropped from Redis and made again never
-- reuses an earlier number (I5).
local function next_seq(s, now)
  s.q = math.max(s.q + 1, now)
  return s.q
end

-- The flight is due at `at`: within `direct` of now its message goes out at once (taken,
-- returned to the caller to publish, countdown in us); otherwise it waits in the index.
local function schedule(s, at, now, c)
  if at - now <= c.direct then
    local seq = next_seq(s, now)
    s.tk = 1
    s.ta = math.max(at, now)
    return seq, math.max(at - now, 0)
  end
  s.tk = 0
  s.ta = 0
  return 0, 0
end

local function end_run(s)
  s.ru, s.rs, s.rt, s.rf, s.rn, s.rb, s.rr, s.rc = 0, 0, 0, 0, 0, 0, 0, 0
end

-- `claimed` triggers of the live run go back to pending: as the open flight, due at once, when
-- nothing is pending (with `payload`, the run's, unless collecting); else into it (the newer
-- payload wins; collected items of the run, those left in its set, come first; the earlier
-- first trigger, anchor and max_wait bound are kept). The string fields are written at once:
-- the caller may claim again.
local function rejoin(s, now, c, claimed, payload)
  if s.p == 0 then
    s.f = s.f + 1
    s.ft = s.rf
    s.an = s.rn
    s.bd = s.rb
    if s.lt == 0 then s.lt = s.rf end
    s.d = now
    s.df = 0
    s.tk, s.ta = 0, 0
    s.ac = 0
    if s.cs == 0 then redis.call('HSET', c.h, 'pl', payload or '') end
  else
    -- newer triggers keep their quiet period (I3); the run's triggers are older
    s.ft = math.min(s.ft, s.rf)
    s.an = math.min(s.an, s.rn)
    if s.rb > 0 and (s.bd == 0 or s.rb < s.bd) then s.bd = s.rb end
  end
  if s.cs > 0 then
    -- the run's items come first: their scores are lower, and MIN keeps the first place
    redis.call('ZUNIONSTORE', c.items, 2, c.items, c.run_items, 'AGGREGATE', 'MIN')
  end
  s.p = s.p + claimed
end

-- The live run's claimed triggers (collect: items).
local function run_size(s, c)
  if s.cs > 0 then return redis.call('ZCARD', c.run_items) end
  return s.rt
end

-- The live run's triggers go back to pending (a lost run, or a failed one to retry); its
-- claim is taken out of the totals so I6 counts them once, in the run that covers them; all
-- of them now count as attempted.
local function unclaim(s, now, c)
  local claimed = s.rt
  local size = run_size(s, c)
  s.R = math.max(s.R - 1, 0)
  s.M = math.max(s.M - math.max(claimed - 1, 0), 0)
  rejoin(s, now, c, claimed, redis.call('HGET', c.h, 'rp'))
  s.ac = s.ac + size
  if s.cs > 0 then s.ac = math.min(s.ac, redis.call('ZCARD', c.items)) end
  redis.call('HDEL', c.h, 'rp')
  redis.call('DEL', c.run_items)
  s.ra = math.max(s.ra, s.rr)
  end_run(s)
end

-- A record for the durable mirror (recorder.py reads them): fields joined by `|`, the error
-- text last. Kinds: c (claim), f (finish), l (lost run), s (state after another change).
local function record(c, kind, now, s, run_id, extra)
  redis.call('RPUSH', c.rec, table.concat({kind, c.id, c.task, fmt(now), fmt(s.p), fmt(s.f),
    fmt(s.ft), fmt(s.lt), fmt(s.d), fmt(s.r), fmt(s.ru), fmt(s.T), fmt(s.R), fmt(s.M),
    fmt(s.C), fmt(s.lr), fmt(run_id), extra or ''}, '|'))
end

-- A live run whose lease ran out is lost: its triggers go back to pending (I7). Returns the
-- lost run id (0: none).
local function recover_lease(s, now, c)
  if s.ru == 0 or s.ru > now then return 0 end
  local lost = s.r
  local attempt = s.rr
  unclaim(s, now, c)
  s.ra = math.max(s.ra, attempt + 1)  -- a lost run counts as an attempt
  redis.call('HSET', c.h, 'lo', 'lost')
  record(c, 'l', now, s, lost)
  return lost
end

local function concat(a, b)
  if not a then return b end
  if b then for _, x in ipairs(b) do a[#a + 1] = x end end
  return a
end
