#!/usr/bin/env bash
# Latency at the same load: the gateway, HAProxy and nginx each offered the same
# paced load (64 connections, each waiting about PACE_MS after an answer, so about
# 20,000 requests a second at the default 3 ms, half of what one proxy thread
# serves here), and their p50/p90/p99 printed side by side, a round at a time with
# the order turned each round. compare.sh's closed loop runs each proxy as fast as it
# goes, so its p99s compare proxies at different loads; this one compares them at one.
#
#   bench/paced.sh target/release/moodle-gateway "W1 W2 W3"     # ~2.5 min
#   PACE_MS=1.5 ROUNDS=5 bench/paced.sh target/release/moodle-gateway W1
#
# Needs nginx, haproxy and wrk. Knobs: ROUNDS [3], SECS [5] seconds a run, PACE_MS [3],
# PIN [0]: 1 gives the proxies the last CPU to themselves and wrk and the backends the
# others (taskset), the shape of a production gateway whose PHP runs elsewhere; on a
# shared core the scheduler's placement of the backends moves the p99 as much as the
# proxies do. The paced load fits on the remaining CPU of a 2-core machine.
set -uo pipefail
BIN=$(realpath "$1"); WORKLOADS=${2:-W1}; SECS=${SECS:-5}; ROUNDS=${ROUNDS:-3}; PACE=${PACE_MS:-3}
export BENCH_PORT_BASE=18800 PROXY_THREADS=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib/stack.sh"
BENCHTOOL=$here/lib/benchtool.py
CLK_TCK=$(getconf CLK_TCK)
stack_init
export GATEWAY_CMD="$BIN --config \"\$GATEWAY_CONFIG\""
stack_start >/dev/null 2>&1
WRK=(wrk)
if [ "${PIN:-0}" = 1 ]; then
    last=$(( $(nproc) - 1 ))
    [ "$last" -ge 1 ] || { echo "PIN=1 needs two CPUs or more"; stack_stop >/dev/null 2>&1; exit 1; }
    rest=0-$((last - 1))
    for proxy in gateway haproxy nginx; do
        for p in $(pid_tree "${PROXY_PID[$proxy]}"); do taskset -a -p -c "$last" "$p" >/dev/null; done
    done
    for p in $(pid_tree "$BACKENDS_PID"); do taskset -a -p -c "$rest" "$p" >/dev/null; done
    WRK=(taskset -c "$rest" wrk)
    echo "pinned: the proxies on CPU $last, wrk and the backends on $rest"
fi
python3 "$BENCHTOOL" gen-ids 10000 "$WORK/ids.txt"
for proxy in gateway haproxy nginx; do
    python3 "$BENCHTOOL" warmup "http://127.0.0.1:${PROXY_PORT[$proxy]}" "$WORK/ids.txt" \
        "$WORK/map-$proxy" >/dev/null 2>&1
done
echo "pace ${PACE} ms, 64 connections, ${SECS} s a run; latency in ms, proxy CPU in µs a request"
LINES=$WORK/paced.lines
for wl in $WORKLOADS; do
    for round in $(seq "$ROUNDS"); do
        case $((round % 3)) in
            1) order="gateway haproxy nginx" ;;
            2) order="haproxy nginx gateway" ;;
            0) order="nginx gateway haproxy" ;;
        esac
        for proxy in $order; do
            pid=${PROXY_PID[$proxy]}
            c0=$(cpu_ticks "$pid")
            result=$(BENCH_LUA=$here/lua/workload.lua BENCH_PACE_MS=$PACE BENCH_WORKLOAD=$wl \
                BENCH_IDS=$WORK/ids.txt "${WRK[@]}" -t1 -c64 -d"${SECS}s" -s "$here/lua/paced.lua" \
                "http://127.0.0.1:${PROXY_PORT[$proxy]}" 2>&1 | grep BENCHRESULT)
            c1=$(cpu_ticks "$pid")
            if [ -z "$result" ]; then
                echo "$wl r$round $proxy: wrk gave no result (is the proxy up? run with KEEP_WORK=1 and read its log)"
                continue
            fi
            echo "$wl r$round $proxy $result cpu_ticks=$((c1 - c0)) clk_tck=$CLK_TCK" | awk '{
                for (i = 4; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                printf "%s %s %-8s %7.0f req/s  p50 %5.2f  p90 %5.2f  p99 %5.2f  cpu %5.1f  errors %d\n",
                    $1, $2, $3, v["requests"] / (v["duration_us"] / 1e6), v["p50_us"] / 1000,
                    v["p90_us"] / 1000, v["p99_us"] / 1000,
                    v["cpu_ticks"] / v["clk_tck"] * 1e6 / v["requests"],
                    v["err_connect"] + v["err_read"] + v["err_write"] + v["err_status"] + v["err_timeout"] }' |
                tee -a "$LINES"
        done
    done
done
echo
python3 "$BENCHTOOL" paced-summary "$LINES"
stack_stop >/dev/null 2>&1
