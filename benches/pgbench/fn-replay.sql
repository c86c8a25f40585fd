\set k random(1, 100000)
SELECT * FROM claim_fn('acct_42', 'POST /payments', 'key-' || :k, decode(repeat('ab',32),'hex'), :k, 1000, 100, 200);
