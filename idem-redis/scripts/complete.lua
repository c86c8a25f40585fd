-- complete: store the outcome if in flight under the token.
-- Layouts 1 and 2 (src/record.rs); Lua positions are 1-based.
-- The body inside the record (layout 2): KEYS[1] record only, and
--   ARGV[1] token (8 bytes)   ARGV[2] key expiry then response expiry (2 x 8 bytes)
--   ARGV[3] outcome byte      ARGV[4] key TTL (ms, >= 1)
--   ARGV[5] the body then its length (4 bytes)
--   ARGV[6], only when given: the resource id replacing the record's
-- Otherwise: KEYS[1] record, KEYS[2] body, KEYS[3] (only with ARGV[5] '1')
--   the body's staging key, all in one hash tag; ARGV[1] to ARGV[4] as above,
--   ARGV[5] how the body is stored:
--   '0' none (ARGV[6], ARGV[7] empty);
--   '1' in the body key, staged at KEYS[3] by a native `SET … PX <body TTL>`
--       just before this script, in the same pipeline, and moved into place;
--   '2' in the body key: ARGV[6], set with PX ARGV[7]
--   ARGV[8], only when given: the resource id replacing the record's
-- A large body kept in the body key never passes through Lua (copying it in
-- and out of Lua costs more than the extra command): a completion moves the
-- staged key into place with RENAME (which keeps its TTL); any other answer
-- drops it.
-- Reply: 1 done, 0 lease lost, 2 already completed under this token (the
-- record is rewritten, so that a WAIT after this call covers the completion:
-- a retry after a lost reply or acknowledgement; a body kept inside the
-- record is dropped then if its response expiry has passed).
-- Every string made here costs about 8 instructions a byte (Redis's Lua
-- hashes all of it to intern it), so the common path makes few: the token
-- is compared in place (`find` at 3, plain), the record is one
-- concatenation, and a body over 512 bytes (ARGV[5] over 516 with its
-- length) is appended natively (APPEND) instead of copied into it: measured
-- under callgrind, the extra command costs less than the copy from about
-- that size (a 4 KiB body: 109,000 instructions per completion instead of
-- 151,000; 256 B: 63,000 instead of 59,500).
local v = redis.call('GET', KEYS[1])
if v and string.byte(v, 1) == 1 and string.byte(v, 2) == 102 and #v >= 78
    and string.find(v, ARGV[1], 3, true) == 3 then
  local inline = #KEYS == 1
  local r = ARGV[inline and 6 or 8]
  local rest
  if r then
    local n = 78 + string.byte(v, 72) * 256 + string.byte(v, 73) + string.byte(v, 74) * 256
      + string.byte(v, 75) + string.byte(v, 76) * 256 + string.byte(v, 77)
    rest = string.sub(v, 72, 77) .. '\1' .. string.sub(v, 79, n) .. r
  else
    rest = string.sub(v, 72)
  end
  if inline then
    local b = ARGV[5]
    if #b > 516 then
      redis.call('SET', KEYS[1], '\2c' .. string.sub(v, 3, 22) .. ARGV[2]
        .. string.sub(v, 39, 70) .. ARGV[3] .. rest, 'PX', ARGV[4])
      redis.call('APPEND', KEYS[1], b)
    else
      redis.call('SET', KEYS[1], '\2c' .. string.sub(v, 3, 22) .. ARGV[2]
        .. string.sub(v, 39, 70) .. ARGV[3] .. rest .. b, 'PX', ARGV[4])
    end
    return 1
  end
  local m = ARGV[5]
  redis.call('SET', KEYS[1], '\1c' .. string.sub(v, 3, 22) .. ARGV[2] .. string.sub(v, 39, 70)
    .. ARGV[3] .. rest, 'PX', ARGV[4])
  if m == '2' then
    redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[7])
  elseif m == '1' and not redis.pcall('RENAME', KEYS[3], KEYS[2]).err then
    return 1
  else
    -- No body, or a staged body gone already (a response TTL of 1 ms).
    redis.call('DEL', KEYS[2])
  end
  return 1
end
-- Not in flight under this token: nothing is stored.
if #KEYS == 3 then redis.call('DEL', KEYS[3]) end
if not v then return 0 end
local b = string.byte(v, 1)
if not ((b == 1 and #v >= 78) or (b == 2 and #v >= 82)) then
  return redis.error_reply('IDEMCORRUPT the record has an unknown layout')
end
if string.byte(v, 2) ~= 99 or string.sub(v, 3, 10) ~= ARGV[1] then return 0 end
if b == 2 then
  -- Completed under this token, its body inside: past the response expiry
  -- the body is dropped and the record goes back to layout 1. The time now
  -- is the key expiry minus its TTL (exact unless the TTL was raised to
  -- 1 ms, when the key, and so the response, has expired anyway).
  local e, k = 0, 0
  for i = 31, 38 do e = e * 256 + string.byte(v, i) end
  for i = 1, 8 do k = k * 256 + string.byte(ARGV[2], i) end
  if string.byte(v, 31) >= 128 then e = e - 18446744073709551616 end
  if string.byte(ARGV[2], 1) >= 128 then k = k - 18446744073709551616 end
  if e <= k - tonumber(ARGV[4]) then
    local n = ((string.byte(v, -4) * 256 + string.byte(v, -3)) * 256
      + string.byte(v, -2)) * 256 + string.byte(v, -1)
    v = '\1' .. string.sub(v, 2, -5 - n)
  end
end
redis.call('SET', KEYS[1], v, 'KEEPTTL')
return 2
