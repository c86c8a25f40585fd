-- bound-rising-fresh.sql on t_nosweep (no sweep index; see schema.sql).
\set k random(200000, 9000000000000000)
INSERT INTO t_nosweep (owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) VALUES ('acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), 'in_flight', :k, 1, 100, 200, (extract(epoch from clock_timestamp()) * 1000000)::bigint) ON CONFLICT (owner, operation, key) DO NOTHING;
UPDATE t_nosweep SET state='completed', outcome='success', response=decode(repeat('cd',256),'hex'), response_expires_at=9e15, key_expires_at=9e15, lease_until=0 WHERE owner = 'acct_42' AND operation = 'POST /payments' AND key = 'key-' || :k AND token = :k AND state='in_flight';
