-- The pump takes due index entries of one shard. Twin of DatabaseBackend.take and
-- KeyModel.take. KEYS: [1] the shard's rec list (names the slot); the rest is named from
-- ARGV[5], the shard's key prefix ("<prefix>{<shard>}:").
-- ARGV: [1] now_us (0: Redis TIME), [2] limit, [3] retake_us, [4] direct_us, [5] prefix,
-- [6] n tasks, then per task: name, idle TTL in ms.
-- Returns {again, us until the first entry left ('none': empty), then per dispatch: id, seq,
-- task index, label (what monitoring shows of the key)}.
local now = clock()
local limit = tonumber(ARGV[2])
local prefix = ARGV[5]
local n = tonumber(ARGV[6])
local tasks = {}
local found = {}
for i = 1, n do
  local j = 7 + 2 * (i - 1)
  tasks[i] = {name = ARGV[j], ttl = ARGV[j + 1]}
  local due = prefix .. 'due:' .. ARGV[j]
  local got = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for k = 1, #got, 2 do found[#found + 1] = {got[k], tonumber(got[k + 1]), i} end
end
table.sort(found, function(a, b)
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[1] < b[1]
end)
local out = {0, -1}
local again = 0
for k = 1, math.min(#found, limit) do
  local id, ti = found[k][1], found[k][3]
  local t = tasks[ti]
  local c = key_ctx(prefix .. id, id, t.name, 0, ARGV[3], ARGV[4], t.ttl)
  if redis.call('EXISTS', c.h) == 0 then
    redis.call('ZREM', c.due, id)  -- state gone (the durable record restores the flight)
  else
    local s, o = load_state(c.h)
    local lost = recover_lease(s, now, c)
local extra = nil
    local seq = 0
    if s.p > 0 and (s.ru == 0 or s.o == 1) and s.d <= now then
      if s.tk == 1 then again = again + 1 else next_seq(s, now) end
      s.tk = 1
      s.ta = now
      seq = s.q
    end
    save(c.h, s, o, extra)
    reindex(s, c)
    if seq > 0 then
      out[#out + 1] = id
      out[#out + 1] = fmt(seq)
      out[#out + 1] = ti
      -- what monitoring shows of the key: its short readable key when it is whole; else
      -- (a default key, or one cut to the hash's short length) the stored payload, marked
      -- with a leading NUL (no key or payload holds one), from which the pump builds the
      -- whole key (dispatch.label_of); a collecting task's: a list of its first item
      local label = redis.call('HGET', c.h, 'k') or ''
      if label == '' or string.sub(label, -3) == '\226\128\166' then
        local pl = redis.call('HGET', c.h, 'pl')
        if not pl and s.cs > 0 then
          local first = redis.call('ZRANGE', c.items, 0, 0)[1]
          if first then pl = '[' .. first .. ']' end
        end
        if pl and #pl <= 4096 then label = '\0' .. pl end
      end
      out[#out + 1] = label
    end
  end
end
-- each index's `next` becomes its first score again (the pumps sleep until the earliest)
local first = -1
for i = 1, n do
  local due = prefix .. 'due:' .. tasks[i].name
  local nxt = prefix .. 'next:' .. tasks[i].name
  local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  if #head > 0 then
    local score = tonumber(head[2])
    redis.call('SET', nxt, fmt(score))
    if first < 0 or score < first then first = score end
  else
    redis.call('DEL', nxt)
  end
end
out[1] = again
if first >= 0 then out[2] = fmt(first - now) else out[2] = 'none' end
return out
