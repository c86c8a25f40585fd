-- swap: replace a record the client read, if it still holds exactly what
-- was read (a takeover, a new record over one expired on the engine's clock,
-- an operator's release or delete). The client decides; this only makes the
-- decision atomic.
-- KEYS[1] record, KEYS[2] body (same hash tag)
-- ARGV[1] the value read   ARGV[2] the new value ('' deletes record and body)
-- ARGV[3] 'new': set the TTL to ARGV[4] ms and delete the old body;
--         'keep': keep the TTL, raised to ARGV[4] ms if lower ('' never)
-- Reply: 1 swapped, 0 the record changed since it was read.
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1], KEYS[2])
elseif ARGV[3] == 'new' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
  redis.call('DEL', KEYS[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  if ARGV[4] ~= '' and redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
  end
end
return 1
