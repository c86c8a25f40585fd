-- The minimal pattern's replay when it cannot know the key is a replay: its
-- insert first (nothing inserted), then its read (two statements).
\set k random(1, 100000)
INSERT INTO t_min (key, done) VALUES ('key-' || :k, false) ON CONFLICT DO NOTHING;
SELECT done, body FROM t_min WHERE key = 'key-' || :k;
