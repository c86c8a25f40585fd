-- The PL/pgSQL claim measured against the CTE (benches/README.md, "Issue 22,
-- second pass"): read first, insert only if nothing was found. Load it after
-- schema.sql; fn_replay.sql and fn_fresh.sql call it.
CREATE OR REPLACE FUNCTION claim_fn(o text, op text, k text, fp bytea, tok bigint, nw bigint, lease bigint, kexp bigint)
RETURNS TABLE(kind text, fingerprint bytea, state text, attempt int, lease_until bigint, resource_id text, outcome text, response bytea, response_expires_at bigint, key_expires_at bigint, token bigint)
LANGUAGE plpgsql AS $f$
BEGIN
  RETURN QUERY SELECT 'existing'::text, t.fingerprint, t.state, t.attempt, t.lease_until, t.resource_id, t.outcome,
     CASE WHEN t.response_expires_at > nw THEN t.response END, t.response_expires_at, t.key_expires_at, t.token
     FROM t_cur t WHERE t.owner = o AND t.operation = op AND t.key = k;
  IF FOUND THEN RETURN; END IF;
  RETURN QUERY INSERT INTO t_cur AS t (owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at)
     VALUES (o, op, k, fp, 'in_flight', tok, 1, lease, GREATEST(kexp, lease), lease)
     ON CONFLICT (owner, operation, key) DO NOTHING
     RETURNING 'claimed'::text, NULL::bytea, NULL::text, t.attempt, NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::bigint, NULL::bigint, NULL::bigint;
END $f$;
