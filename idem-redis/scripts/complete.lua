-- complete: store the outcome if in flight under the token.
-- Layout 1 (src/record.rs); Lua positions are 1-based.
-- KEYS[1] record, KEYS[2] body, KEYS[3] (only when ARGV[5] is '1') the
--   body's staging key; all share one hash tag
-- ARGV[1] token (8 bytes)   ARGV[2] key expiry then response expiry (2 x 8 bytes)
-- ARGV[3] outcome byte      ARGV[4] key TTL (ms, >= 1)
-- ARGV[5] '0' when no body is stored; '1' if the body value was staged at
--         KEYS[3] (by a native `SET … PX <body TTL>` just before this script,
--         in the same pipeline); '2' if it is ARGV[8], set with PX ARGV[9]
-- ARGV[6] '1' if the resource id in ARGV[7] replaces the record's
-- A large body never passes through Lua (copying it in and out of Lua costs
-- more than the extra command): a completion moves the staged key into place
-- with RENAME (which keeps its TTL); any other answer drops it.
-- Reply: 1 done, 0 lease lost, 2 already completed under this token (the
-- record is rewritten unchanged, so that a WAIT after this call covers the
-- completion: a retry after a lost reply or acknowledgement).
local v = redis.call('GET', KEYS[1])
local s = v and string.byte(v, 1) == 1 and #v >= 78 and string.sub(v, 3, 10) == ARGV[1]
  and string.sub(v, 2, 2)
if s ~= 'f' then
  if ARGV[5] == '1' then redis.call('DEL', KEYS[3]) end
  if v and (string.byte(v, 1) ~= 1 or #v < 78) then
    return redis.error_reply('IDEMCORRUPT the record has an unknown layout')
  end
  if s == 'c' then
    redis.call('SET', KEYS[1], v, 'KEEPTTL')
    return 2
  end
  return 0
end
local rest
if ARGV[6] == '1' then
  local n = 78 + string.byte(v, 72) * 256 + string.byte(v, 73) + string.byte(v, 74) * 256
    + string.byte(v, 75) + string.byte(v, 76) * 256 + string.byte(v, 77)
  rest = string.sub(v, 72, 77) .. '\1' .. string.sub(v, 79, n) .. ARGV[7]
else
  rest = string.sub(v, 72)
end
redis.call('SET', KEYS[1],
  '\1c' .. string.sub(v, 3, 22) .. ARGV[2] .. string.sub(v, 39, 70) .. ARGV[3] .. rest,
  'PX', ARGV[4])
if ARGV[5] == '2' then
  redis.call('SET', KEYS[2], ARGV[8], 'PX', ARGV[9])
elseif ARGV[5] == '1' and not redis.pcall('RENAME', KEYS[3], KEYS[2]).err then
  return 1
else
  -- No body, or a staged body gone already (a response TTL of 1 ms).
  redis.call('DEL', KEYS[2])
end
return 1
