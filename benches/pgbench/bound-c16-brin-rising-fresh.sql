-- bound-rising-fresh.sql's plain insert and completion on t_c16_brin (see schema.sql).
\set k random(200000, 9000000000000000)
INSERT INTO t_c16_brin (id, owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) VALUES (decode(md5(:k::text), 'hex'), 'acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), 'in_flight', :k, 1, 100, 200, (extract(epoch from clock_timestamp()) * 1000000)::bigint) ON CONFLICT (id) DO NOTHING;
UPDATE t_c16_brin SET state='completed', outcome='success', response=decode(repeat('cd',256),'hex'), response_expires_at=9e15, key_expires_at=9e15, lease_until=0 WHERE id = decode(md5(:k::text), 'hex') AND token = :k AND state='in_flight';
