#!/usr/bin/env bash
# System calls per request of the gateway, HAProxy and nginx under the same
# workload, counted by `strace -c` while wrk drives each in turn: where the kernel's
# share of a request goes (reads that end in EAGAIN, epoll_ctl churn, writes that
# could be one writev). Counts, not times: strace slows every proxy alike, so only
# the calls per request and their mix are worth reading.
#
#   bench/syscalls.sh target/release/moodle-gateway W1      # ~1 min
#
# Needs strace (Debian: apt-get install strace) besides nginx, haproxy and wrk.
# Knobs: SECS [5] seconds counted per proxy, after a 2 s warm-up that is not.
set -uo pipefail
BIN=$(realpath "$1"); WLD=${2:-W1}; SECS=${SECS:-5}
command -v strace >/dev/null || { echo "missing strace: apt-get install strace" >&2; exit 1; }
export BENCH_PORT_BASE=18600 PROXY_THREADS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib/stack.sh"
BENCHTOOL=$here/lib/benchtool.py
stack_init
export GATEWAY_CMD="$BIN --config \"\$GATEWAY_CONFIG\""
stack_start >/dev/null 2>&1
python3 "$BENCHTOOL" gen-ids 10000 "$WORK/ids.txt"
drive() { # port seconds -> requests
    BENCH_WORKLOAD=$WLD BENCH_IDS=$WORK/ids.txt wrk -t1 -c64 -d"$2"s -s "$BENCH_DIR/lua/workload.lua" \
        "http://127.0.0.1:$1" 2>&1 | grep -o 'requests=[0-9]*' | cut -d= -f2
}
for proxy in gateway haproxy nginx; do
    port=${PROXY_PORT[$proxy]}
    python3 "$BENCHTOOL" warmup "http://127.0.0.1:$port" "$WORK/ids.txt" "$WORK/map-$proxy" >/dev/null 2>&1
    drive "$port" 2 >/dev/null
    # Every process of the proxy (nginx's workers, not its master only).
    pids=$(pid_tree "${PROXY_PID[$proxy]}" | tr ' ' '\n' | sed 's/^/-p /' | tr '\n' ' ')
    # shellcheck disable=SC2086
    strace -f -c -o "$WORK/$proxy.strace" $pids 2>/dev/null &
    tracer=$!
    sleep 0.5
    requests=$(drive "$port" "$SECS")
    kill -INT $tracer; wait $tracer 2>/dev/null
    echo "== $proxy $WLD: $requests requests"
    awk -v n="$requests" '
        /^[ ]*[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9]+/ {
            calls = $4; errors = ($6 == "") ? 0 : $5; name = ($6 == "") ? $5 : $6
            if (name == "total") next
            total += calls
            printf "  %-16s %6.2f per request%s\n", name, calls / n, errors ? sprintf(" (%.2f failed: EAGAIN and the like)", errors / n) : ""
        }
        END { printf "  %-16s %6.2f per request\n", "all", total / n }' "$WORK/$proxy.strace" | sort -k2 -rn
done
stack_stop >/dev/null 2>&1
