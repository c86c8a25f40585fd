-- release_in_flight: an operator ends an in-flight record's lease now, so the
-- next claim with the same fingerprint takes it over as a recovery. The token,
-- checkpoint and attempt stay (the holder, if alive, may still complete).
-- KEYS[1] record hash   ARGV[1] now (ms)   ARGV[2] expected attempt or ''
-- Reply: 1 released, 0 not live, not in flight, or at another attempt.
local r = redis.call('HMGET', KEYS[1], 's', 'l', 'k', 'a')
local now = tonumber(ARGV[1])
local kexp = tonumber(r[3])
if r[1] ~= 'in_flight' or not kexp or kexp <= now then return 0 end
if ARGV[2] ~= '' and r[4] ~= ARGV[2] then return 0 end
local l = tonumber(r[2])
if not l or l > now then redis.call('HSET', KEYS[1], 'l', ARGV[1]) end
return 1
