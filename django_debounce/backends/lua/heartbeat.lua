-- Extend the lease of run ARGV[8] by ARGV[9] us. Twin of DatabaseBackend.heartbeat and
-- KeyModel.heartbeat. Returns 1 when the lease was extended.
local c = single_ctx()
local h = c.h
if redis.call('EXISTS', h) == 0 then return 0 end
local now = clock()
local s, o = load_state(h)
-- a lease that ran out (ru <= now, as recover_lease has it) is not extended
if s.r ~= tonumber(ARGV[8]) or s.ru == 0 or s.ru <= now then return 0 end
s.ru = now + tonumber(ARGV[9])
save(h, s, o)
reindex(s, c)
return 1
