#!/usr/bin/env bash
# Pinned, alternating-rounds run of the store bench: idem against the store's
# own statements without the engine (the engine's cost) and against the
# minimal pattern a user would hand-write (the design's cost).
#
# It starts its own servers, pinned to core $SERVER_CORE (default 0): a
# throwaway Postgres cluster (PG_PORT, default 7232, in a temp dir, as the
# `postgres` user when run as root), a throwaway redis-server (REDIS_PORT,
# default 7279) and a throwaway mariadbd (MY_PORT, default 7306, in the temp
# dir, a 256 MB buffer pool, no binary log), runs the bench pinned to core
# $CLIENT_CORE (default 1) with
# IDEM_BENCH_PAIRED=$ROUNDS (default 5) alternating rounds per group (PG_OPTS adds
# server settings, e.g. "-c synchronous_commit=off"), prints
# the ratio table (also written to target/idem-bench-store.md) and stops the
# servers by pid. Nothing shared is touched.
#
#   benches/bench.sh                          # every backend, 256 B and 4 KiB
#   IDEM_BENCH_ONLY=postgres,sqlite-file IDEM_BENCH_BODIES=256 benches/bench.sh
#   IDEM_BENCH_BIN="before/store after/store" AB_ROUNDS=2 benches/bench.sh
#       # binaries built elsewhere, alternated on the same servers
#
# Needs: taskset, redis-server, PostgreSQL's initdb/pg_ctl (PG_BIN, default
# the newest /usr/lib/postgresql/*/bin), mariadb-install-db and mariadbd.
# Without them, that backend is skipped (the bench reports it unreachable;
# MariaDB falls back to IDEM_MYSQL_URL or the default server, unpinned).
set -euo pipefail
cd "$(dirname "$0")/.."

SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
ROUNDS=${ROUNDS:-5}
PG_PORT=${PG_PORT:-7232}
REDIS_PORT=${REDIS_PORT:-7279}
MY_PORT=${MY_PORT:-7306}
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
TMP=$(mktemp -d /tmp/idem-bench.XXXXXX)
PG_PID= REDIS_PID= MY_PID=

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

cleanup() {
    [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null || true
    if [ -n "$MY_PID" ]; then
        kill "$MY_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$MY_PID" 2>/dev/null || break; sleep 0.1; done
    fi
    if [ -n "$PG_PID" ]; then
        as_pg "$PG_BIN/pg_ctl" -D "$TMP/pg" -m fast -w stop >/dev/null 2>&1 || kill "$PG_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

# IDEM_BENCH_BIN: run these already built bench binaries instead of building
# this tree's (a before/after comparison on the same servers).
if [ -z "${IDEM_BENCH_BIN:-}" ]; then
    echo "building the bench (release)..." >&2
    cargo bench --bench store --all-features --no-run >/dev/null 2>&1 || cargo bench --bench store --all-features --no-run
fi

if [ -x "$PG_BIN/initdb" ]; then
    [ "$(id -u)" = 0 ] && chown postgres "$TMP"
    as_pg "$PG_BIN/initdb" -D "$TMP/pg" -U postgres --auth=trust >/dev/null
    # The server and every backend it forks inherit the pinning.
    as_pg taskset -c "$SERVER_CORE" "$PG_BIN/pg_ctl" -D "$TMP/pg" -w -l "$TMP/pg.log" \
        -o "-p $PG_PORT -k $TMP -c listen_addresses=127.0.0.1 -c shared_buffers=128MB ${PG_OPTS:-}" start >/dev/null
    PG_PID=$(head -1 "$TMP/pg/postmaster.pid")
    export IDEM_POSTGRES_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
else
    echo "NOTE: no initdb under PG_BIN=$PG_BIN: Postgres uses IDEM_POSTGRES_URL or the default server, unpinned" >&2
fi

if command -v redis-server >/dev/null; then
    taskset -c "$SERVER_CORE" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
        --appendonly no --daemonize no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
    export IDEM_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/"
fi

if command -v mariadb-install-db >/dev/null && command -v mariadbd >/dev/null; then
    mkdir -p "$TMP/my/tmp"
    mariadb-install-db --no-defaults --user="$(id -un)" --skip-test-db \
        --auth-root-authentication-method=normal --datadir="$TMP/my/data" \
        --tmpdir="$TMP/my/tmp" >"$TMP/my/install.log" 2>&1
    taskset -c "$SERVER_CORE" mariadbd --no-defaults --user="$(id -un)" --bind-address=127.0.0.1 \
        --port="$MY_PORT" --datadir="$TMP/my/data" --socket="$TMP/my/sock" --tmpdir="$TMP/my/tmp" \
        --pid-file="$TMP/my/pid" --log-error="$TMP/my/err.log" --skip-log-bin \
        --innodb-buffer-pool-size=256M </dev/null >/dev/null 2>&1 &
    MY_PID=$!
    for _ in $(seq 100); do
        mariadb -h 127.0.0.1 -P "$MY_PORT" -u root -e "CREATE DATABASE IF NOT EXISTS test" 2>/dev/null && break
        sleep 0.1
    done
    export IDEM_MYSQL_URL="mysql://root@127.0.0.1:$MY_PORT/test"
fi

echo "servers on core $SERVER_CORE, client on core $CLIENT_CORE, $ROUNDS alternating rounds" >&2
if [ -z "${IDEM_BENCH_BIN:-}" ]; then
    IDEM_BENCH_PAIRED=$ROUNDS taskset -c "$CLIENT_CORE" \
        cargo bench --bench store --all-features -- 2>&1 | grep -v '^\s*$' | sed -n '/^| group/,$p'
    exit 0
fi
# Several binaries (before/after): AB_ROUNDS passes over them on the same
# servers, the order reversed every other pass, each table headed by its
# binary and pass.
read -r -a bins <<<"$IDEM_BENCH_BIN"
for bin in "${bins[@]}"; do [ -x "$bin" ] || { echo "IDEM_BENCH_BIN: $bin is not executable" >&2; exit 2; }; done
for pass in $(seq "${AB_ROUNDS:-1}"); do
    order=("${bins[@]}")
    if [ $((pass % 2)) = 0 ]; then
        order=(); for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("${bins[i]}"); done
    fi
    for bin in "${order[@]}"; do
        echo "### $(basename "$bin"), pass $pass"
        IDEM_BENCH_PAIRED=$ROUNDS taskset -c "$CLIENT_CORE" "$bin" --bench 2>&1 \
            | grep -v '^\s*$' | sed -n '/^| group/,$p'
    done
done
