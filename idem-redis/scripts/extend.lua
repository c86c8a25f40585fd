-- extend: move the lease's end, if in flight under the token.
-- Runs after held.lua (the record in flight under the token, as `v`).
-- Layout 1 (src/record.rs). KEYS[1] record
-- ARGV[1] token (8 bytes)   ARGV[2] lease end (8 bytes)   ARGV[3] lease end (ms)
-- Reply: 1 done, 0 lease lost.
-- A lease is never outlived by its key: a lease ending after the key's expiry
-- moves the expiry (and the native TTL, by the same amount) to the lease's end.
local k = 0
for i = 23, 30 do k = k * 256 + string.byte(v, i) end
if string.byte(v, 23) >= 128 then k = k - 18446744073709551616 end
local l = tonumber(ARGV[3])
if l > k then
  redis.call('SET', KEYS[1], string.sub(v, 1, 14) .. ARGV[2] .. ARGV[2] .. string.sub(v, 31), 'KEEPTTL')
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    redis.call('PEXPIRE', KEYS[1], string.format('%d', math.min(pttl + (l - k), 1000000000000000)))
  end
else
  redis.call('SET', KEYS[1], string.sub(v, 1, 14) .. ARGV[2] .. string.sub(v, 23), 'KEEPTTL')
end
return 1
