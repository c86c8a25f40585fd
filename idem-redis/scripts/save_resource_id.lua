-- save_resource_id: set the resource id, if in flight under the token.
-- Runs after held.lua (the record in flight under the token, as `v`).
-- Layout 1 (src/record.rs). KEYS[1] record
-- ARGV[1] token (8 bytes)   ARGV[2] resource id
-- Reply: 1 done, 0 lease lost.
local n = 78 + string.byte(v, 72) * 256 + string.byte(v, 73) + string.byte(v, 74) * 256
  + string.byte(v, 75) + string.byte(v, 76) * 256 + string.byte(v, 77)
redis.call('SET', KEYS[1], string.sub(v, 1, 77) .. '\1' .. string.sub(v, 79, n) .. ARGV[2], 'KEEPTTL')
return 1
