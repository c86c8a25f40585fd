\set k random(1, 100000)
SELECT fingerprint, state, attempt, lease_until, resource_id, outcome, response, response_expires_at, key_expires_at, token FROM t_cur WHERE owner = 'acct_42' AND operation = 'POST /payments' AND key = 'key-' || :k;
