-- claim: insert, take over, or report the standing record. One call, atomic.
-- KEYS[1] record hash, KEYS[2] response body (same hash tag)
-- ARGV[1] fingerprint (32 raw bytes)   ARGV[2] token
-- ARGV[3] now (ms)                     ARGV[4] lease_until (ms)
-- ARGV[5] key_expires_at (ms)          ARGV[6] key TTL for PEXPIRE (ms, >= 1)
-- ARGV[7..9] owner, operation, key (optional): stored readable in a new
--            record (`io`, `ip`, `ik`) so operators can list it
-- Reply: {0, attempt, reason, checkpoint} when claimed
--        (reason 0 new, 1 lease expired, 2 released),
--        {1, f, s, a, l, k, x, o, e, body} for the standing record.
local rec = KEYS[1]
local now = tonumber(ARGV[3])
local r = redis.call('HMGET', rec, 'f', 's', 'a', 'l', 'k', 'x', 'o', 'e')
local kexp = tonumber(r[5])
local present = r[1] or r[2] or r[5]
if not present or (kexp and kexp <= now) then
  -- Absent, or its key expired on the engine's clock: a new operation.
  if present then redis.call('DEL', rec) end
  local fields = {'f', ARGV[1], 's', 'in_flight', 't', ARGV[2], 'a', '1', 'l', ARGV[4], 'k', ARGV[5]}
  if ARGV[9] then
    fields[13], fields[14], fields[15], fields[16], fields[17], fields[18] =
      'io', ARGV[7], 'ip', ARGV[8], 'ik', ARGV[9]
  end
  redis.call('HSET', rec, unpack(fields))
  redis.call('PEXPIRE', rec, ARGV[6])
  return {0, 1, 0, false}
end
local attempt = tonumber(r[3])
if r[1] == ARGV[1] and attempt and kexp then
  local reason = 0
  if r[2] == 'released' then
    reason = 2
  elseif r[2] == 'in_flight' and tonumber(r[4]) and tonumber(r[4]) <= now then
    reason = 1
  end
  if reason > 0 then
    redis.call('HSET', rec, 's', 'in_flight', 't', ARGV[2], 'a', attempt + 1, 'l', ARGV[4])
    return {0, attempt + 1, reason, r[6]}
  end
end
-- Anything else stands unchanged; its body only while now < e.
local body = false
local e = tonumber(r[8])
if r[2] == 'completed' and e and now < e then body = redis.call('GET', KEYS[2]) end
return {1, r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], body}
