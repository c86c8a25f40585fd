-- release: after a transient failure, if in flight under the token.
-- Runs after held.lua (the record in flight under the token, as `v`).
-- Layout 1 (src/record.rs). KEYS[1] record
-- ARGV[1] token (8 bytes)   ARGV[2] now (8 bytes: the lease ends now)
-- Reply: 1 done, 0 lease lost. Resource id, attempt and TTL are kept.
redis.call('SET', KEYS[1], '\1r' .. string.sub(v, 3, 14) .. ARGV[2] .. string.sub(v, 23), 'KEEPTTL')
return 1
