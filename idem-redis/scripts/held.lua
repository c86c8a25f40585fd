-- held: the first lines of every script that acts only on a record in flight
-- under the caller's token (release, save_resource_id, extend). KEYS[1]
-- record, ARGV[1] token (8 bytes). Leaves the record's value in `v`, or
-- replies 0 (lease lost) for a record absent, completed (layout 2 holds only
-- completed records: never in flight) or held by another token, and an error
-- for a record of no known layout. Layout 1: src/record.rs.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if string.byte(v, 1) == 2 then return 0 end
if string.byte(v, 1) ~= 1 or #v < 78 then
  return redis.error_reply('IDEMCORRUPT the record has an unknown layout')
end
if string.sub(v, 2, 2) ~= 'f' or string.sub(v, 3, 10) ~= ARGV[1] then return 0 end
