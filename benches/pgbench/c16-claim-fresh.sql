-- idem's claim and completion (claim-fresh.sql) on t_c16_brin (see c16-claim-replay.sql).
\set k random(200000, 9000000000000000)
\set now 1000
WITH cur AS (SELECT fingerprint, state, attempt, lease_until, resource_id, outcome, CASE WHEN response_expires_at > :now THEN response END AS response, response_expires_at, key_expires_at, token FROM t_c16_brin WHERE id = decode(md5(:k::text), 'hex')),
ins AS (INSERT INTO t_c16_brin (id, owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) SELECT decode(md5(:k::text), 'hex'), 'acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), 'in_flight', :k, 1, 100, 200, (extract(epoch from clock_timestamp()) * 1000000)::bigint WHERE NOT EXISTS (SELECT 1 FROM cur) ON CONFLICT (id) DO NOTHING RETURNING attempt)
SELECT 'claimed', NULL::bytea, NULL::text, attempt, NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::bigint, NULL::bigint, NULL::bigint FROM ins UNION ALL SELECT 'existing', fingerprint, state, attempt, lease_until, resource_id, outcome, response, response_expires_at, key_expires_at, token FROM cur;
UPDATE t_c16_brin SET state='completed', outcome='success', response=decode(repeat('cd',256),'hex'), response_expires_at=9e15, key_expires_at=9e15, lease_until=0 WHERE id = decode(md5(:k::text), 'hex') AND token = :k AND state='in_flight';
