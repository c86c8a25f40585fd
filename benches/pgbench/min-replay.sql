\set k random(1, 100000)
SELECT done, body FROM t_min WHERE key = 'key-' || :k;
