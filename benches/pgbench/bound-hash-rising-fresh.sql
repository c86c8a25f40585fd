-- bound-rising-fresh.sql on t_hash (a 32-byte key; see schema.sql).
\set k random(200000, 9000000000000000)
INSERT INTO t_hash (id, owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) VALUES (decode(lpad(to_hex(:k::bigint),64,'0'),'hex'), 'acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), 'in_flight', :k, 1, 100, 200, (extract(epoch from clock_timestamp()) * 1000000)::bigint) ON CONFLICT (id) DO NOTHING;
UPDATE t_hash SET state='completed', outcome='success', response=decode(repeat('cd',256),'hex'), response_expires_at=9e15, key_expires_at=9e15, lease_until=0 WHERE id = decode(lpad(to_hex(:k::bigint),64,'0'),'hex') AND token = :k AND state='in_flight';
