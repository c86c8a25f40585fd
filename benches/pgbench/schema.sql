-- Tables of the issue-22 pgbench runs (benches/README.md, "Issue 22, second
-- pass"): t_cur is idem's layout, t_hash the same keyed by one 32-byte
-- bytea, t_min the minimal pattern's table; 100,000 completed records each.
DROP TABLE IF EXISTS t_cur, t_hash, t_min;
CREATE TABLE t_cur (
    owner text NOT NULL, operation text NOT NULL, key text NOT NULL,
    fingerprint bytea NOT NULL, state text NOT NULL, token bigint NOT NULL, attempt integer NOT NULL,
    lease_until bigint NOT NULL, resource_id text, outcome text, response bytea,
    response_expires_at bigint, key_expires_at bigint NOT NULL, sweep_at bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, operation, key),
    CHECK (state IN ('in_flight','released','completed')), CHECK (outcome IN ('success','failure','not_stored')),
    CHECK (octet_length(fingerprint) = 32));
CREATE INDEX t_cur_sweep ON t_cur (sweep_at, owner, operation, key);
CREATE TABLE t_hash (
    id bytea NOT NULL,
    owner text NOT NULL, operation text NOT NULL, key text NOT NULL,
    fingerprint bytea NOT NULL, state text NOT NULL, token bigint NOT NULL, attempt integer NOT NULL,
    lease_until bigint NOT NULL, resource_id text, outcome text, response bytea,
    response_expires_at bigint, key_expires_at bigint NOT NULL, sweep_at bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (id),
    CHECK (state IN ('in_flight','released','completed')), CHECK (outcome IN ('success','failure','not_stored')),
    CHECK (octet_length(fingerprint) = 32), CHECK (octet_length(id) = 32));
CREATE INDEX t_hash_sweep ON t_hash (sweep_at, id);
CREATE TABLE t_min (key text PRIMARY KEY, done boolean NOT NULL, body bytea);
INSERT INTO t_cur SELECT 'acct_42', 'POST /payments', 'key-' || g, decode(repeat('ab',32),'hex'), 'completed', g, 1, 0, NULL, 'success', decode(repeat('cd',256),'hex'), 9e15, 9e15, 9e15 FROM generate_series(1,100000) g;
INSERT INTO t_hash SELECT decode(lpad(to_hex(g),64,'0'),'hex'), 'acct_42', 'POST /payments', 'key-' || g, decode(repeat('ab',32),'hex'), 'completed', g, 1, 0, NULL, 'success', decode(repeat('cd',256),'hex'), 9e15, 9e15, 9e15 FROM generate_series(1,100000) g;
INSERT INTO t_min SELECT 'key-' || g, true, decode(repeat('cd',256),'hex') FROM generate_series(1,100000) g;
VACUUM ANALYZE;
-- The compact key passed as a parameter (no function in the statement): the
-- key number's decimal text as the bytea key.
DROP TABLE IF EXISTS t_h2;
CREATE TABLE t_h2 (LIKE t_hash INCLUDING DEFAULTS);
ALTER TABLE t_h2 ADD PRIMARY KEY (id);
CREATE INDEX t_h2_sweep ON t_h2 (sweep_at, id);
INSERT INTO t_h2 SELECT convert_to(g::text,'UTF8'), 'acct_42', 'POST /payments', 'key-' || g, decode(repeat('ab',32),'hex'), 'completed', g, 1, 0, NULL, 'success', decode(repeat('cd',256),'hex'), 9e15, 9e15, 9e15 FROM generate_series(1,100000) g;
VACUUM ANALYZE t_h2;
