-- release: after a transient failure, if in flight under the token.
-- Layout 1 (src/record.rs); a record of layout 2 is completed. KEYS[1] record
-- ARGV[1] token (8 bytes)   ARGV[2] now (8 bytes: the lease ends now)
-- Reply: 1 done, 0 lease lost. Resource id, attempt and TTL are kept.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
-- Layout 2 holds only completed records: never in flight.
if string.byte(v, 1) == 2 then return 0 end
if string.byte(v, 1) ~= 1 or #v < 78 then
  return redis.error_reply('IDEMCORRUPT the record has an unknown layout')
end
if string.sub(v, 2, 2) ~= 'f' or string.sub(v, 3, 10) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], '\1r' .. string.sub(v, 3, 14) .. ARGV[2] .. string.sub(v, 23), 'KEEPTTL')
return 1
