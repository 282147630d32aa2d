-- The lease keeper extends the live runs of one shard. Twin of DatabaseBackend.extend and
-- KeyModel.extend. KEYS: [1] the shard's rec list (names the slot).
-- ARGV: [1] now_us (0: Redis TIME), [2] prefix, [3] retake_us, [4] n, then per run: id,
-- seq (the message that claimed it), lease_us, task name.
-- Returns, per run, the new lease end minus now in us (-1: not the live run any more).
local now = clock()
local out = {}
for i = 1, tonumber(ARGV[4]) do
  local j = 5 + 4 * (i - 1)
  local id, seq, lease = ARGV[j], tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local c = key_ctx(ARGV[2] .. id, id, ARGV[j + 3], 0, ARGV[3], 0, 0)
  local result = -1
  if seq > 0 and redis.call('EXISTS', c.h) == 1 then
    local s, o = load_state(c.h)
    if s.ru > now and s.rs == seq then
      s.ru = now + lease
      save(c.h, s, o)
      reindex(s, c)
      result = lease
    end
  end
  out[i] = fmt(result)
end
return out
