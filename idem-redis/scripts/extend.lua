-- extend: move the lease's end, if in flight under the token.
-- KEYS[1] record hash   ARGV[1] token   ARGV[2] lease_until (ms)
-- Reply: 1 done, 0 lease lost.
-- A lease is never outlived by its key: a lease ending after the key's expiry
-- moves the expiry (and the native TTL, by the same amount) to the lease's end.
local r = redis.call('HMGET', KEYS[1], 's', 't', 'k')
if r[1] ~= 'in_flight' or r[2] ~= ARGV[1] then return 0 end
local l = tonumber(ARGV[2])
local k = tonumber(r[3])
if k and l > k then
  redis.call('HSET', KEYS[1], 'l', ARGV[2], 'k', ARGV[2])
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    redis.call('PEXPIRE', KEYS[1], string.format('%d', math.min(pttl + (l - k), 1000000000000000)))
  end
else
  redis.call('HSET', KEYS[1], 'l', ARGV[2])
end
return 1
