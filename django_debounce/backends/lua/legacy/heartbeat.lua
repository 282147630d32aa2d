-- ARGV: now_us (0: Redis TIME), run_id, lease_us, grace_us, ttl_ms.
-- Returns 1 when the lease was extended.
local h = KEYS[1]
if redis.call('EXISTS', h) == 0 then return 0 end
local now = clock()
local s = load_state(h)
-- a lease that ran out (ru <= now, as recover_lease has it) is not extended
if s.r ~= tonumber(ARGV[2]) or s.ru == 0 or s.ru <= now then return 0 end
s.ru = now + tonumber(ARGV[3])
save(h, s, now, tonumber(ARGV[5]), tonumber(ARGV[4]))
return 1
