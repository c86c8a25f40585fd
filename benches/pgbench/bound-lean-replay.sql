-- A replay on t_lean: a plain read of idem's record by the short key, the
-- least any layout of idem's record could cost.
\set k random(1, 100000)
SELECT fingerprint, state, attempt, lease_until, resource_id, outcome, response, response_expires_at, key_expires_at, token FROM t_lean WHERE id = :k::text::bytea;
