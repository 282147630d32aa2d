-- Make the pending flight due now. ARGV: grace_us, ttl_ms. Returns {seq} or {0}.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0} end
local now = clock()
local s = load_state(h)
if s.p == 0 then return {0} end
s.d = now
schedule(s, now, now)
save(h, s, now, tonumber(ARGV[2]), tonumber(ARGV[1]))
return {fmt(s.q)}
