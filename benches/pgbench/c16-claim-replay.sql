-- idem's claim (claim-replay.sql) on t_c16_brin: the compact layout
-- proposed in the third pass (16-byte key, BRIN sweep index).
\set k random(1, 100000)
\set now 1000
WITH cur AS (SELECT fingerprint, state, attempt, lease_until, resource_id, outcome, CASE WHEN response_expires_at > :now THEN response END AS response, response_expires_at, key_expires_at, token FROM t_c16_brin WHERE id = decode(md5(:k::text), 'hex')),
ins AS (INSERT INTO t_c16_brin (id, owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) SELECT decode(md5(:k::text), 'hex'), 'acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), 'in_flight', :k, 1, 100, 200, (extract(epoch from clock_timestamp()) * 1000000)::bigint WHERE NOT EXISTS (SELECT 1 FROM cur) ON CONFLICT (id) DO NOTHING RETURNING attempt)
SELECT 'claimed', NULL::bytea, NULL::text, attempt, NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::bigint, NULL::bigint, NULL::bigint FROM ins UNION ALL SELECT 'existing', fingerprint, state, attempt, lease_until, resource_id, outcome, response, response_expires_at, key_expires_at, token FROM cur;
