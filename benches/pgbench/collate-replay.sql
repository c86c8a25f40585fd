-- idem's claim on t_c: the key columns in the "C" collation.
\set k random(1, 100000)
\set now 1000
WITH cur AS (SELECT fingerprint, state, attempt, lease_until, resource_id, outcome, CASE WHEN response_expires_at > :now THEN response END AS response, response_expires_at, key_expires_at, token FROM t_c WHERE owner = 'acct_42' AND operation = 'POST /payments' AND key = 'key-' || :k),
ins AS (INSERT INTO t_c (owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) SELECT 'acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), 'in_flight', :k, 1, 100, 200, 100 WHERE NOT EXISTS (SELECT 1 FROM cur) ON CONFLICT (owner, operation, key) DO NOTHING RETURNING attempt)
SELECT 'claimed', NULL::bytea, NULL::text, attempt, NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::bigint, NULL::bigint, NULL::bigint FROM ins UNION ALL SELECT 'existing', fingerprint, state, attempt, lease_until, resource_id, outcome, response, response_expires_at, key_expires_at, token FROM cur;
