-- checkpoint: set the resource id, if in flight under the token.
-- KEYS[1] record hash   ARGV[1] token   ARGV[2] resource id
-- Reply: 1 done, 0 lease lost.
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[1] ~= 'in_flight' or r[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'x', ARGV[2])
return 1
