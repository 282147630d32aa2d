-- Make the pending flight due now (a retry backoff included).
-- ARGV: now_us (0: Redis TIME), grace_us, ttl_ms. Returns {seq} or {0}.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0} end
local now = clock()
local s = load_state(h)
if s.p == 0 then return {0} end
s.d = now
s.nb = 0
schedule(s, now, now)
save(h, s, now, tonumber(ARGV[3]), tonumber(ARGV[2]))
return {fmt(s.q)}
