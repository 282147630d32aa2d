-- ARGV: run_id, lease_us, grace_us, ttl_ms. Returns 1 when the lease was extended.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return 0 end
local now = clock()
local s = load_state(h)
if s.r ~= tonumber(ARGV[1]) or s.ru == 0 or s.ru < now then return 0 end
s.ru = now + tonumber(ARGV[2])
save(h, s, now, tonumber(ARGV[4]), tonumber(ARGV[3]))
return 1
