-- complete: store the outcome if in flight under the token.
-- KEYS[1] record hash, KEYS[2] response body
-- ARGV[1] token   ARGV[2] outcome   ARGV[3] response_expires_at   ARGV[4] key_expires_at
-- ARGV[5] body TTL (ms, >= 1)   ARGV[6] key TTL (ms, >= 1)
-- ARGV[7] '1' if a body follows in ARGV[8]   ARGV[9] '1' if a resource id follows in ARGV[10]
-- Reply: 1 done, 0 lease lost, 2 already completed under this token (nothing
-- changed but the token, rewritten so that a WAIT after this call covers the
-- completion: a retry after a lost reply or acknowledgement).
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[2] ~= ARGV[1] then return 0 end
if r[1] == 'completed' then
  redis.call('HSET', KEYS[1], 't', ARGV[1])
  return 2
end
if r[1] ~= 'in_flight' then return 0 end
if ARGV[9] == '1' then
  redis.call('HSET', KEYS[1], 's', 'completed', 'o', ARGV[2], 'e', ARGV[3], 'k', ARGV[4], 'x', ARGV[10])
else
  redis.call('HSET', KEYS[1], 's', 'completed', 'o', ARGV[2], 'e', ARGV[3], 'k', ARGV[4])
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
if ARGV[7] == '1' then
  redis.call('SET', KEYS[2], ARGV[8], 'PX', ARGV[5])
else
  redis.call('DEL', KEYS[2])
end
return 1
