-- idem's claim turned around: the insert first (its ON CONFLICT check is the
-- read of a fresh key), the record read only when nothing was inserted.
\set k random(200000, 9000000000000000)
\set now 1000
WITH ins AS (INSERT INTO t_cur (owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) VALUES ('acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), 'in_flight', :k, 1, 100, 200, 100) ON CONFLICT (owner, operation, key) DO NOTHING RETURNING attempt)
SELECT 'claimed', NULL::bytea, NULL::text, attempt, NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::bigint, NULL::bigint, NULL::bigint FROM ins UNION ALL SELECT 'existing', fingerprint, state, attempt, lease_until, resource_id, outcome, CASE WHEN response_expires_at > :now THEN response END, response_expires_at, key_expires_at, token FROM t_cur WHERE owner = 'acct_42' AND operation = 'POST /payments' AND key = 'key-' || :k AND NOT EXISTS (SELECT 1 FROM ins);
UPDATE t_cur SET state='completed', outcome='success', response=decode(repeat('cd',256),'hex'), response_expires_at=9e15, key_expires_at=9e15, lease_until=0 WHERE owner = 'acct_42' AND operation = 'POST /payments' AND key = 'key-' || :k AND token = :k AND state='in_flight';
