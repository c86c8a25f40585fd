#!/usr/bin/env bash
# The issue-22 pgbench runs (benches/README.md, "Issue 22, second pass" and
# "third pass"):
# a throwaway PostgreSQL cluster on core $SERVER_CORE (default 0) and port
# $PG_PORT (default 7240), pgbench with 8 clients on core $CLIENT_CORE
# (default 1), ROUNDS (default 3) alternating rounds of SECONDS_PER (default
# 4) seconds per script (SCRIPTS picks some, by name without .sql; default
# every script here and every variant made below). Prints "round script
# tps"; stops the cluster by its pid.
set -euo pipefail
cd "$(dirname "$0")"
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
PG_PORT=${PG_PORT:-7240}
TMP=$(mktemp -d /tmp/idem-pgbench.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$TMP"
trap 'as_pg "$PG_BIN/pg_ctl" -D "$TMP/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
as_pg "$PG_BIN/initdb" -D "$TMP/data" -A trust >/dev/null
as_pg taskset -c "${SERVER_CORE:-0}" "$PG_BIN/pg_ctl" -D "$TMP/data" -l "$TMP/log" -w \
    -o "-p $PG_PORT -k $TMP -c listen_addresses=127.0.0.1 -c synchronous_commit=off -c shared_buffers=256MB" start >/dev/null
psql() { command psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }
psql -f schema.sql 2>/dev/null
psql -f claim-fn.sql
# The scripts, and the variants that are another script on another table of
# schema.sql (made here from their source, so that they follow it): name,
# source, table.
mkdir "$TMP/scripts"
cp ./*.sql "$TMP/scripts/"
while read -r name source table; do
    { echo "-- $source.sql on $table (see schema.sql)."; grep -v '^--' "$source.sql" | sed "s/t_cur/$table/g"; } \
        > "$TMP/scripts/$name.sql"
done <<'VARIANTS'
collate-replay claim-replay t_c
collate-fresh claim-fresh t_c
sweep-nosweep-replay claim-replay t_nosweep
sweep-nosweep-fresh claim-fresh t_nosweep
sweep-narrow-replay claim-replay t_narrow
sweep-narrow-fresh claim-fresh t_narrow
sweep-brin-replay claim-replay t_brin
sweep-brin-fresh claim-fresh t_brin
bound-nosweep-rising-fresh bound-rising-fresh t_nosweep
VARIANTS
cd "$TMP/scripts"
for round in $(seq "${ROUNDS:-3}"); do
    for script in ${SCRIPTS:-$(ls ./*.sql | sed 's|^\./||; s/\.sql$//' | grep -v -e '^schema$' -e '^claim-fn$')}; do
        tps=$(taskset -c "${CLIENT_CORE:-1}" pgbench -n -M prepared -h 127.0.0.1 -p "$PG_PORT" -U postgres \
            -c 8 -j 1 -T "${SECONDS_PER:-4}" -f "$script.sql" postgres 2>&1 | grep -oP 'tps = \K[0-9]+')
        echo "$round $script $tps"
    done
done
