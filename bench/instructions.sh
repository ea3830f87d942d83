#!/usr/bin/env bash
# User-space instructions per request of one gateway build, counted by callgrind
# while wrk drives a workload through it. Exact where CPU timings on a shared
# machine vary by 10 %: use it to judge a hot-path change, then confirm the change
# in CPU time with bench/ab.sh (the kernel's share does not show here).
#
#   bench/instructions.sh target/release/moodle-gateway W1      # ~1 min
#
# Needs valgrind (Debian: apt-get install valgrind) besides nginx and wrk. Knobs:
# SECS [5] seconds counted, after a 2 s warm-up that is not; GATEWAY_TEMPLATE and
# GATEWAY_EXTRA change the config (see below).
set -uo pipefail
BIN=$(realpath "$1"); WLD=${2:-W1}; SECS=${SECS:-5}
command -v valgrind >/dev/null || { echo "missing valgrind: apt-get install valgrind" >&2; exit 1; }
export BENCH_PORT_BASE=18500 PROXY_THREADS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib/stack.sh"
BENCHTOOL=$here/lib/benchtool.py
stack_init
start_backends >/dev/null 2>&1
common_kv
d=$WORK/gateway; mkdir -p "$d"
render "${GATEWAY_TEMPLATE:-$BENCH_DIR/gateway.config.toml.tmpl}" "$d/config.toml" "${CKV[@]}"
# GATEWAY_EXTRA: TOML appended to the config (bench/store.sh adds a [store]).
[ -n "${GATEWAY_EXTRA:-}" ] && printf '\n%s\n' "$GATEWAY_EXTRA" >> "$d/config.toml"
(cd "$d" && TOKIO_WORKER_THREADS=1 exec valgrind --tool=callgrind --callgrind-out-file="$d/callgrind.out" \
    "$BIN" --config "$d/config.toml" >"$d/log" 2>&1) &
PID=$!; STARTED_PIDS+=($PID)
wait_port "$GATEWAY_PORT" $PID 60
drive() { # seconds -> wrk's BENCHRESULT line
    BENCH_WORKLOAD=$WLD BENCH_IDS=$WORK/ids.txt wrk -t1 -c64 -d"$1"s -s "$BENCH_DIR/lua/workload.lua" \
        "http://127.0.0.1:$GATEWAY_PORT" 2>&1 | grep BENCHRESULT
}
python3 "$BENCHTOOL" gen-ids 10000 "$WORK/ids.txt"
python3 "$BENCHTOOL" warmup "http://127.0.0.1:$GATEWAY_PORT" "$WORK/ids.txt" "$WORK/map" >/dev/null 2>&1
drive 2 >/dev/null
callgrind_control -z $PID >/dev/null 2>&1
requests=$(drive "$SECS" | grep -o 'requests=[0-9]*' | cut -d= -f2)
callgrind_control -d $PID >/dev/null 2>&1
sleep 1
counts=$(ls -t "$d"/callgrind.out* | head -1)
total=$(awk '/^(summary|totals):/ {print $2; exit}' "$counts")
echo "$(basename "$BIN") $WLD: $requests requests, $(( total / requests )) user-space instructions per request"
# AFTER_RUN: a command run while the gateway still serves (bench/store.sh reads its metrics).
[ -n "${AFTER_RUN:-}" ] && GATEWAY_ADMIN_PORT=$GATEWAY_ADMIN_PORT bash -c "$AFTER_RUN"
[ -n "${KEEP_PROFILE:-}" ] && cp "$counts" "$KEEP_PROFILE" && echo "profile: $KEEP_PROFILE (callgrind_annotate it)"
kill $PID; cp "$d/log" /tmp/instructions-gateway.log 2>/dev/null
