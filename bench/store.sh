#!/usr/bin/env bash
# The shared store's cost: user-space instructions per request of one build with
# `[store] kind = "memory"` and with `kind = "redis"` (a real redis-server on
# loopback), W1 (returning students) and W2 (new visitors), interleaved in one
# run, with what Redis was asked beside them.
#
#   bench/store.sh target/release/moodle-gateway        # ~5 min
#
# Needs what bench/instructions.sh needs, and redis-server (Debian: apt-get install
# redis-server). The store's timeout is raised to 10 s here: under callgrind the
# gateway runs ~50 times slower, and a request must never fall back to a local
# deal or the count would leave the Redis work out. The fallbacks are printed
# after each run: they must be 0.
set -uo pipefail
BIN=$(realpath "$1")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v redis-server >/dev/null || { echo "missing redis-server: apt-get install redis-server" >&2; exit 1; }
PORT=18590
dir=$(mktemp -d)
redis-server --bind 127.0.0.1 --port $PORT --save "" --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
REDIS=$!
trap 'kill $REDIS 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
STORE='[store]
kind = "redis"
url = "redis://127.0.0.1:'$PORT'"
name = "bench"
secret = "bench-store-secret-0123456789abcdef0123"
timeout = "10s"'
FALLBACKS='curl -s -H "authorization: Bearer bench-token-0123456789abcdef0123456789" \
  "http://127.0.0.1:$GATEWAY_ADMIN_PORT/metrics" | grep "^moodle_gateway_store_fallbacks_total" | tr "\n" " "; echo'
for round in 1 2; do
    for wld in W1 W2; do
        "$here/instructions.sh" "$BIN" "$wld" | sed "s/^/memory round $round: /"
        redis-cli -p $PORT flushall >/dev/null
        redis-cli -p $PORT config resetstat >/dev/null
        GATEWAY_EXTRA="$STORE" AFTER_RUN="$FALLBACKS" "$here/instructions.sh" "$BIN" "$wld" \
            | sed "s/^/redis  round $round: /"
        # What Redis was asked over the whole run (the 10,000-id warm-up included).
        redis-cli -p $PORT info commandstats | grep -oE '^cmdstat_[a-z]+:calls=[0-9]+,usec=[0-9]+' \
            | tr '\n' ' ' | sed "s/^/redis  round $round: commands: /"; echo
    done
done
