-- Drop the pending flight. ARGV: grace_us, ttl_ms. Returns {dropped, snapshot}.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return {0, {}} end
local now = clock()
local s = load_state(h)
if s.p == 0 then return {0, {}} end
local dropped = s.p
s.C = s.C + dropped
s.p = 0
s.ft, s.lt, s.d = 0, 0, 0
s.q = s.q + 1
s.sc = 0
s.sa = 0
save(h, s, now, tonumber(ARGV[2]), tonumber(ARGV[1]), {'pl', ''})
return {dropped, snapshot(h)}
