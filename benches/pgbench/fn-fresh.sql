\set k random(200000, 9000000000000000)
SELECT * FROM claim_fn('acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), :k, 1000, 100, 200);
UPDATE t_cur SET state='completed', outcome='success', response=decode(repeat('cd',256),'hex'), response_expires_at=9e15, key_expires_at=9e15, lease_until=0 WHERE owner = 'acct_42' AND operation = 'POST /payments' AND key = 'key-' || :k AND token = :k AND state='in_flight';
