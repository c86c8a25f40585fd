-- delete_completed: an operator deletes a completed (or key-expired) record.
-- Records in flight or released are refused: only a recovery may follow them.
-- KEYS[1] record hash, KEYS[2] response body   ARGV[1] now (ms)
-- Reply: 1 deleted, 0 absent or refused.
local r = redis.call('HMGET', KEYS[1], 's', 'k')
local kexp = tonumber(r[2])
if not (r[1] or r[2]) then return 0 end
if r[1] ~= 'completed' and not (kexp and kexp <= tonumber(ARGV[1])) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
