-- migrate: rewrite a record of the hash layout (before layout 1: a hash at
-- KEYS[1], its body at KEYS[2]) in layout 1 (a string at KEYS[1], its body
-- with a header at KEYS[3]), if the hash still holds what the client read.
-- Native TTLs are carried over.
-- ARGV[1..12] '=' .. the value of f s t a l k x o e io ip ik as read, '' when absent
-- ARGV[13] the record in layout 1   ARGV[14] the body header (version, token)
-- Reply: 1 migrated, 0 changed since read.
local r = redis.call('HMGET', KEYS[1], 'f', 's', 't', 'a', 'l', 'k', 'x', 'o', 'e', 'io', 'ip', 'ik')
for i = 1, 12 do
  local seen = ''
  if r[i] then seen = '=' .. r[i] end
  if seen ~= ARGV[i] then return 0 end
end
local p = redis.call('PTTL', KEYS[1])
local body = redis.call('GET', KEYS[2])
local pb = redis.call('PTTL', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
if p > 0 then
  redis.call('SET', KEYS[1], ARGV[13], 'PX', p)
else
  redis.call('SET', KEYS[1], ARGV[13])
end
if body then
  if pb > 0 then
    redis.call('SET', KEYS[3], ARGV[14] .. body, 'PX', pb)
  else
    redis.call('SET', KEYS[3], ARGV[14] .. body)
  end
end
return 1
