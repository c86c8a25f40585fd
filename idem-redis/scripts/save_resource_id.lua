-- save_resource_id: set the resource id, if in flight under the token.
-- Layout 1 (src/record.rs); a record of layout 2 is completed. KEYS[1] record
-- ARGV[1] token (8 bytes)   ARGV[2] resource id
-- Reply: 1 done, 0 lease lost.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
-- Layout 2 holds only completed records: never in flight.
if string.byte(v, 1) == 2 then return 0 end
if string.byte(v, 1) ~= 1 or #v < 78 then
  return redis.error_reply('IDEMCORRUPT the record has an unknown layout')
end
if string.sub(v, 2, 2) ~= 'f' or string.sub(v, 3, 10) ~= ARGV[1] then return 0 end
local n = 78 + string.byte(v, 72) * 256 + string.byte(v, 73) + string.byte(v, 74) * 256
  + string.byte(v, 75) + string.byte(v, 76) * 256 + string.byte(v, 77)
redis.call('SET', KEYS[1], string.sub(v, 1, 77) .. '\1' .. string.sub(v, 79, n) .. ARGV[2], 'KEEPTTL')
return 1
