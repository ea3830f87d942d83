#!/usr/bin/env bash
# The side-by-side harness over TLS: the gateway, nginx and HAProxy each terminate TLS
# with one self-signed certificate (lib/tls.sh) in front of the same backends as
# compare.sh, with the same workloads, one proxy thread each. Modes, as arguments
# (none: all four, in this order), each on a stack of its own:
#
#   keepalive  W1-W4 with wrk over https on 64 kept connections (run.sh, BENCH_TLS=1)
#   close      W1-W4 with `Connection: close`: a TCP connection and a TLS handshake per
#              request. wrk offers each new connection the session of its last one, so
#              every handshake after a connection's first is a resumed one
#   students   STUDENTS students each clicking CLICKS times about THINK s apart, each
#              keeping its connection as a browser does and resuming with its last TLS
#              session when the proxy closed it (lib/students.py): new connections, full
#              and resumed handshakes and proxy CPU per click
#   h2         W1 and W4 over TLS and HTTP/2 (h2load), one learned session for every request
#
#   bench/tls.sh                                  # all four, ~15 min
#   bench/tls.sh students                         # ~4 min
#   KEEPALIVE=10 bench/tls.sh students            # a read longer than the keep-alive: resumption
#   STUDENTS=50 THINK=2 bench/tls.sh students     # a quick look, ~1 min
#
# Every proxy keeps an idle client connection KEEPALIVE seconds, in every mode (the
# gateway's `[timeouts] keep_alive`, nginx's `keepalive_timeout`, HAProxy's
# `timeout http-keep-alive` and `timeout client`). Needs nginx, haproxy, wrk, openssl,
# python3 and, for h2, h2load (Debian: apt-get install nginx-light haproxy wrk openssl
# nghttp2-client). Knobs: KEEPALIVE [75], STUDENTS [1000], CLICKS [3], THINK [15] s,
# SEED [1] (the students' schedule), ROUNDS [3; students 1], DURATION [5] s a run,
# CONNS [64], H2_WORKLOADS ["W1 W4"], H2_STREAMS [1] streams at once per connection,
# GATEWAY_BIN (a built gateway; default: build target/release/moodle-gateway),
# BENCH_PORT_BASE [19100], KEEP_WORK; and run.sh's for keepalive and close.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODES=${*:-keepalive close students h2}
need="nginx haproxy python3 openssl"
[[ " $MODES " == *" keepalive "* || " $MODES " == *" close "* ]] && need+=" wrk"
[[ " $MODES " == *" h2 "* ]] && need+=" h2load"
for tool in $need; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "missing $tool: apt-get install nginx-light haproxy wrk openssl python3 nghttp2-client" >&2
        exit 1
    }
done
for mode in $MODES; do
    case $mode in keepalive | close | students | h2) ;; *) echo "unknown mode $mode (keepalive, close, students, h2)" >&2; exit 2 ;; esac
done
if [ -z "${GATEWAY_BIN:-}" ]; then
    cargo build --release --locked --bin moodle-gateway
    GATEWAY_BIN=target/release/moodle-gateway
fi
# An absolute path: the gateway runs in its own scratch directory (see compare.sh).
export GATEWAY_CMD="$(realpath "$GATEWAY_BIN") --config \"\$GATEWAY_CONFIG\""
export BENCH_TLS=1 BENCH_KEEPALIVE=${KEEPALIVE:-75} BENCH_PORT_BASE=${BENCH_PORT_BASE:-19100}
STUDENTS=${STUDENTS:-1000} CLICKS=${CLICKS:-3} THINK=${THINK:-15} SEED=${SEED:-1}
DURATION=${DURATION:-5} CONNS=${CONNS:-64} H2_WORKLOADS=${H2_WORKLOADS:-"W1 W4"} H2_STREAMS=${H2_STREAMS:-1}
here=$PWD/bench
# shellcheck source=lib/stack.sh
. "$here/lib/stack.sh"
CLK_TCK=$(getconf CLK_TCK)

# rotated ROUND: the proxies in the order of that round (no proxy always goes first)
rotated() {
    local i n=${#PROXIES[@]}
    for ((i = 0; i < n; i++)); do echo "${PROXIES[$(((i + $1 - 1) % n))]}"; done
}

# One stack for a mode: backends and proxies up, W1's sessions learned, routing checked.
mode_stack() {
    BENCH_LOAD_TOOL=""   # checked above, for the modes asked
    stack_init
    stack_start
    log "learn $N_IDS sessions per proxy and check the routing"
    learn_and_check >&2
}

students_mode() {
    local round p c0 c1 out raw
    mode_stack
    raw=$WORK/students.jsonl
    for ((round = 1; round <= ${ROUNDS:-1}; round++)); do
        for p in $(rotated "$round"); do
            log "r$round $p: $STUDENTS students, $CLICKS clicks each, about $THINK s apart"
            c0=$(cpu_ticks "${PROXY_PID[$p]}")
            out=$(python3 "$here/lib/students.py" run "$(proxy_url "$p")" "$WORK/ids.txt" \
                "$STUDENTS" "$CLICKS" "$THINK" "$SEED")
            c1=$(cpu_ticks "${PROXY_PID[$p]}")
            echo "${out%\}}, \"proxy\": \"$p\", \"round\": $round, \"cpu_ticks\": $((c1 - c0)), \"clk_tck\": $CLK_TCK, \"keepalive\": $BENCH_KEEPALIVE}" >>"$raw"
            log "r$round $p: $(tail -n 1 "$raw")"
        done
    done
    echo
    echo "## Students with think time over TLS ($(date -u +%Y-%m-%dT%H:%MZ), one proxy thread each)"
    echo
    python3 "$here/lib/students.py" report "$raw"
    echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# h2load_run ROUND WORKLOAD PROXY SECONDS: one h2load run, a raw line for benchtool's
# report appended to $RAW (round 0, the warm-up, is not kept)
h2load_run() {
    local round=$1 wl=$2 p=$3 secs=$4 path c0 c1 k0 k1 t0 t1 s0 s1 tot0 tot1 out
    case $wl in
        W1) path=/course/view.php?id=2 ;;
        W4) path=/pluginfile.php/42/mod_scorm/content/1/big.bin ;;
        *) die "h2 runs W1 and W4 only, not $wl" ;;
    esac
    read -r s0 tot0 < <(steal_ticks)
    c0=$(cpu_ticks "${PROXY_PID[$p]}") k0=$(sys_ticks "${PROXY_PID[$p]}") t0=$(date +%s%N)
    out=$(h2load -c "$CONNS" -m "$H2_STREAMS" -t 1 -D "$secs" \
        -H "user-agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0" \
        -H "accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8" \
        -H "accept-language: en-GB,en;q=0.5" -H "accept-encoding: identity" \
        -H "cookie: MOODLEID1_=%25F1%25CB%252B; MoodleSession=$(head -n 1 "$WORK/ids.txt")" \
        "$(proxy_url "$p")$path" 2>&1) || true
    t1=$(date +%s%N) c1=$(cpu_ticks "${PROXY_PID[$p]}") k1=$(sys_ticks "${PROXY_PID[$p]}")
    read -r s1 tot1 < <(steal_ticks)
    grep -q '^Application protocol: h2$' <<<"$out" || { echo "$out" >&2; die "$p did not speak HTTP/2 to h2load"; }
    [ "$round" = 0 ] && return 0
    awk -v round="$round" -v wl="$wl" -v t="$p" -v cpu=$((c1 - c0)) -v sys=$((k1 - k0)) -v tck="$CLK_TCK" \
        -v wall=$(((t1 - t0) / 1000000)) -v steal=$((s1 - s0)) -v total=$((tot1 - tot0)) '
        function us(x) { return x ~ /us$/ ? x + 0 : x ~ /ms$/ ? x * 1000 : x * 1e6 }
        /^finished in/ { secs = $3 + 0 }
        /^requests:/ { ok = $8; failed = $10 + $12; timeout = $14 }
        /^traffic:/ { gsub(/[()]/, "", $3); bytes = $3 }
        /^time for request:/ { mean = us($6) }
        END { printf "round=%s wl=%s target=%s requests=%d duration_us=%d bytes=%d err_connect=0 err_read=0 err_write=0 err_status=%d err_timeout=%d mean_us=%.1f cpu_ticks=%d sys_ticks=%d clk_tck=%d wall_ms=%d steal_pct=%.2f\n",
                  round, wl, t, ok, secs * 1e6, bytes, failed, timeout, mean, cpu, sys, tck, wall, total ? 100 * steal / total : 0 }' <<<"$out" >>"$RAW"
    log "r$round $wl $p: $(tail -n 1 "$RAW")"
}

h2_mode() {
    local round wl p
    mode_stack
    RAW=$WORK/h2.raw
    : >"$RAW"
    log "warm-up runs (2 s each, not kept)"
    for p in "${PROXIES[@]}"; do h2load_run 0 W1 "$p" 2; done
    for ((round = 1; round <= ${ROUNDS:-3}; round++)); do
        for wl in $H2_WORKLOADS; do
            for p in $(rotated "$round"); do h2load_run "$round" "$wl" "$p" "$DURATION"; done
        done
    done
    echo
    echo "## HTTP/2 over TLS ($(date -u +%Y-%m-%dT%H:%MZ), one proxy thread each, $CONNS connections, $H2_STREAMS stream(s) at once on each, ${DURATION}s x ${ROUNDS:-3} rounds)"
    echo
    python3 "$BENCHTOOL" report "$RAW" "$WORK/verdicts.jsonl"
    echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)"
}

echo "TLS harness: modes $MODES; keep-alive idle timeout ${BENCH_KEEPALIVE}s on every proxy"
for mode in $MODES; do
    case $mode in
        keepalive) DURATION=$DURATION CONNS=$CONNS bench/run.sh ;;
        close) BENCH_CLOSE=1 DURATION=$DURATION CONNS=$CONNS bench/run.sh ;;
        # a subshell each: its stack stops when it ends
        students) (students_mode) ;;
        h2) (h2_mode) ;;
    esac
done
