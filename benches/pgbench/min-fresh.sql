\set k random(200000, 9000000000000000)
INSERT INTO t_min (key, done) VALUES ('key-' || :k, false) ON CONFLICT DO NOTHING;
UPDATE t_min SET done = true, body = decode(repeat('cd',256),'hex') WHERE key = 'key-' || :k;
