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
-- idem's layout with the key columns in the "C" collation (byte order, so
-- every key comparison is a memcmp instead of the database collation's
-- strcoll): t_cur otherwise unchanged.
DROP TABLE IF EXISTS t_c;
CREATE TABLE t_c (LIKE t_cur INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE t_c ALTER COLUMN owner TYPE text COLLATE "C", ALTER COLUMN operation TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C", ADD PRIMARY KEY (owner, operation, key);
CREATE INDEX t_c_sweep ON t_c (sweep_at, owner, operation, key);
INSERT INTO t_c SELECT * FROM t_cur;
VACUUM ANALYZE t_c;
-- idem's layout with other sweep indexes: none at all (the bound of what the
-- sweep index costs), one on `sweep_at` alone, and a BRIN index on
-- `sweep_at` (claims file records at the lease end, so in insertion order).
DROP TABLE IF EXISTS t_nosweep, t_narrow, t_brin;
CREATE TABLE t_nosweep (LIKE t_cur INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE t_nosweep ADD PRIMARY KEY (owner, operation, key);
CREATE TABLE t_narrow (LIKE t_cur INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE t_narrow ADD PRIMARY KEY (owner, operation, key);
CREATE INDEX t_narrow_sweep ON t_narrow (sweep_at);
CREATE TABLE t_brin (LIKE t_cur INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE t_brin ADD PRIMARY KEY (owner, operation, key);
CREATE INDEX t_brin_sweep ON t_brin USING brin (sweep_at);
INSERT INTO t_nosweep SELECT * FROM t_cur;
INSERT INTO t_narrow SELECT * FROM t_cur;
INSERT INTO t_brin SELECT * FROM t_cur;
VACUUM ANALYZE t_nosweep;
VACUUM ANALYZE t_narrow;
VACUUM ANALYZE t_brin;
-- The leanest table idem's record could have: t_h2's short bytea key and
-- no sweep index (nothing could purge it: a bound, not a design).
DROP TABLE IF EXISTS t_lean;
CREATE TABLE t_lean (LIKE t_h2 INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE t_lean ADD PRIMARY KEY (id);
INSERT INTO t_lean SELECT * FROM t_h2;
VACUUM ANALYZE t_lean;
-- A compact layout: a 16-byte key (as a truncated SHA-256 of the record id
-- would be; here md5 of the key number) as the primary key, and the sweep
-- index as BRIN on sweep_at (t_c16_brin) or none (t_c16, a bound).
DROP TABLE IF EXISTS t_c16, t_c16_brin;
CREATE TABLE t_c16 (LIKE t_h2 INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE t_c16 ADD PRIMARY KEY (id);
CREATE TABLE t_c16_brin (LIKE t_h2 INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE t_c16_brin ADD PRIMARY KEY (id);
CREATE INDEX t_c16_brin_sweep ON t_c16_brin USING brin (sweep_at);
INSERT INTO t_c16 SELECT decode(md5(g::text), 'hex'), 'acct_42', 'POST /payments', 'key-' || g, decode(repeat('ab',32),'hex'), 'completed', g, 1, 0, NULL, 'success', decode(repeat('cd',256),'hex'), 9e15, 9e15, 9e15 FROM generate_series(1,100000) g;
INSERT INTO t_c16_brin SELECT * FROM t_c16;
VACUUM ANALYZE t_c16;
VACUUM ANALYZE t_c16_brin;
