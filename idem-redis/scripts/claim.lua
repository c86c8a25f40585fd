-- claim: insert, take over, or report the standing record. One call, atomic.
-- KEYS[1] record hash, KEYS[2] response body (same hash tag)
-- ARGV[1] fingerprint (32 raw bytes)   ARGV[2] token
-- ARGV[3] now (ms)                     ARGV[4] lease_until (ms)
-- ARGV[5] key_expires_at (ms, >= lease_until)
-- ARGV[6] key TTL for PEXPIRE (ms, >= 1)   ARGV[7] lease TTL for PEXPIRE (ms, >= 1)
-- Reply: {0, attempt, reason, checkpoint} when claimed
--        (reason 0 new, 1 lease expired, 2 released),
--        {1, f, s, a, l, k, x, o, e, body} for the standing record.
local rec = KEYS[1]
local now = tonumber(ARGV[3])
local r = redis.call('HMGET', rec, 'f', 's', 'a', 'l', 'k', 'x', 'o', 'e')
local kexp = tonumber(r[5])
local lease = tonumber(r[4])
local present = r[1] or r[2] or r[5]
-- A lease is never outlived by its key: in flight under a lease is live.
local leased = r[2] == 'in_flight' and lease and lease > now
if not present or (kexp and kexp <= now and not leased) then
  -- Absent, or its key expired on the engine's clock: a new operation.
  if present then redis.call('DEL', rec) end
  redis.call('HSET', rec, 'f', ARGV[1], 's', 'in_flight', 't', ARGV[2], 'a', '1', 'l', ARGV[4], 'k', ARGV[5])
  redis.call('PEXPIRE', rec, ARGV[6])
  return {0, 1, 0, false}
end
local attempt = tonumber(r[3])
if r[1] == ARGV[1] and attempt and kexp then
  local reason = 0
  if r[2] == 'released' then
    reason = 2
  elseif r[2] == 'in_flight' and lease and lease <= now then
    reason = 1
  end
  if reason > 0 then
    redis.call('HSET', rec, 's', 'in_flight', 't', ARGV[2], 'a', attempt + 1, 'l', ARGV[4])
    if tonumber(ARGV[4]) > kexp then
      -- Keep the key (and its native TTL) at least until the new lease ends.
      redis.call('HSET', rec, 'k', ARGV[4])
      if redis.call('PTTL', rec) < tonumber(ARGV[7]) then redis.call('PEXPIRE', rec, ARGV[7]) end
    end
    return {0, attempt + 1, reason, r[6]}
  end
end
-- Anything else stands unchanged; its body only while now < e.
local body = false
local e = tonumber(r[8])
if r[2] == 'completed' and e and now < e then body = redis.call('GET', KEYS[2]) end
return {1, r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], body}
