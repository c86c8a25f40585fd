-- fetch: read a record as of the engine's now (read only).
-- KEYS[1] record hash, KEYS[2] response body   ARGV[1] now (ms)
-- Reply: nil when absent or its key expired (and no lease holds), else {f, s, a, l, k, x, o, e, body}.
local now = tonumber(ARGV[1])
local r = redis.call('HMGET', KEYS[1], 'f', 's', 'a', 'l', 'k', 'x', 'o', 'e')
local kexp = tonumber(r[5])
local lease = tonumber(r[4])
-- In flight under a lease is live, whatever the key's expiry says.
local leased = r[2] == 'in_flight' and lease and lease > now
if not (r[1] or r[2] or r[5]) or (kexp and kexp <= now and not leased) then return false end
local body = false
local e = tonumber(r[8])
if r[2] == 'completed' and e and now < e then body = redis.call('GET', KEYS[2]) end
return {r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], body}
