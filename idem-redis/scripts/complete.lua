-- complete: store the outcome if in flight under the token.
-- Layout 1 (src/record.rs); Lua positions are 1-based.
-- KEYS[1] record, KEYS[2] body (same hash tag)
-- ARGV[1] token (8 bytes)   ARGV[2] key expiry then response expiry (2 x 8 bytes)
-- ARGV[3] outcome byte      ARGV[4] key TTL (ms, >= 1)   ARGV[5] body TTL (ms, >= 1)
-- ARGV[6] body value (version, token, body; '' when no body is stored)
-- ARGV[7] '1' if the resource id in ARGV[8] replaces the record's
-- Reply: 1 done, 0 lease lost, 2 already completed under this token (the
-- record is rewritten unchanged, so that a WAIT after this call covers the
-- completion: a retry after a lost reply or acknowledgement).
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if string.byte(v, 1) ~= 1 or #v < 78 then
  return redis.error_reply('IDEMCORRUPT the record has an unknown layout')
end
if string.sub(v, 3, 10) ~= ARGV[1] then return 0 end
local s = string.sub(v, 2, 2)
if s == 'c' then
  redis.call('SET', KEYS[1], v, 'KEEPTTL')
  return 2
end
if s ~= 'f' then return 0 end
local rest
if ARGV[7] == '1' then
  local n = 78 + string.byte(v, 72) * 256 + string.byte(v, 73) + string.byte(v, 74) * 256
    + string.byte(v, 75) + string.byte(v, 76) * 256 + string.byte(v, 77)
  rest = string.sub(v, 72, 77) .. '\1' .. string.sub(v, 79, n) .. ARGV[8]
else
  rest = string.sub(v, 72)
end
redis.call('SET', KEYS[1],
  '\1c' .. string.sub(v, 3, 22) .. ARGV[2] .. string.sub(v, 39, 70) .. ARGV[3] .. rest,
  'PX', ARGV[4])
if ARGV[6] ~= '' then
  redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[5])
else
  redis.call('DEL', KEYS[2])
end
return 1
