#!/usr/bin/env bash
# A/B of two gateway builds: runs both next to HAProxy in front of the same
# backends, interleaving short wrk runs (haproxy, A, B, haproxy, A, B, ...), and
# prints the median proxy CPU per request of each and the ratios B/A and X/HAProxy,
# then the user-space share alone (A and B), where a hot-path change shows first.
# Interleaving in one run is what makes a 5 % difference visible on a noisy machine;
# A and B take turns at going first, which is worth as much.
#
#   cp target/release/moodle-gateway /tmp/gw-before   # build A
#   ... change, cargo build --release ...
#   bench/ab.sh /tmp/gw-before target/release/moodle-gateway W1
#
# Knobs: ROUNDS [6], DUR [3] seconds per run, PROXY_THREADS [1]; A_EXTRA and B_EXTRA
# append TOML to one side's config (bench/store.sh's [store], say).
set -uo pipefail
A=$(realpath "$1"); B=$(realpath "$2"); WLD=${3:-W1}; R=${ROUNDS:-6}; D=${DUR:-3}
export BENCH_PORT_BASE=18100 PROXY_THREADS=${PROXY_THREADS:-1}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib/stack.sh"
BENCHTOOL=$here/lib/benchtool.py
stack_init
start_backends >/dev/null 2>&1
start_haproxy >/dev/null 2>&1
common_kv
start_gw() { # name bin port
  local d=$WORK/$1; mkdir -p $d
  render "$BENCH_DIR/gateway.config.toml.tmpl" "$d/config.toml" "${CKV[@]}"
  sed -i "s/127.0.0.1:$GATEWAY_PORT/127.0.0.1:$3/; s/127.0.0.1:$GATEWAY_ADMIN_PORT/127.0.0.1:$(( $3 + 1 ))/" $d/config.toml
  # A_EXTRA / B_EXTRA: TOML appended to that build's config (one build, two configs).
  local extra=${1}_EXTRA; [ -n "${!extra:-}" ] && printf '\n%s\n' "${!extra}" >> $d/config.toml
  # Its own directory: a state file left by an earlier run must not start it full.
  (cd $d && TOKIO_WORKER_THREADS=$PROXY_THREADS exec $2 --config $d/config.toml >$d/log 2>&1) &
  PROXY_PID[$1]=$!; STARTED_PIDS+=($!); PROXY_PORT[$1]=$3; PROXIES+=($1)
  wait_port $3 $! 20
}
start_gw A $A 18140
start_gw B $B 18150
python3 $BENCHTOOL gen-ids 10000 $WORK/ids.txt
for p in haproxy A B; do python3 $BENCHTOOL warmup http://127.0.0.1:${PROXY_PORT[$p]} $WORK/ids.txt $WORK/map.$p >/dev/null 2>&1; done
run() { # target -> prints cpu us/req, requests, p99 us, user-space cpu us/req
  local pid=${PROXY_PID[$1]} port=${PROXY_PORT[$1]} c0 c1 u0 u1 out reqs
  c0=$(cpu_ticks $pid); u0=$(stat_ticks $pid 12)
  out=$(BENCH_WORKLOAD=$WLD BENCH_IDS=$WORK/ids.txt wrk -t1 -c64 -d${D}s -s $BENCH_DIR/lua/workload.lua http://127.0.0.1:$port 2>&1 | grep BENCHRESULT)
  c1=$(cpu_ticks $pid); u1=$(stat_ticks $pid 12)
  reqs=$(echo "$out" | grep -o 'requests=[0-9]*' | cut -d= -f2)
  p99=$(echo "$out" | grep -o 'p99_us=[0-9.]*' | cut -d= -f2)
  awk -v c=$((c1-c0)) -v u=$((u1-u0)) -v r=$reqs -v t=$(getconf CLK_TCK) -v p=$p99 \
    'BEGIN{printf "%.2f %d %.0f %.2f\n", c/t*1e6/r, r, p, u/t*1e6/r}'
}
for t in haproxy A B; do run $t >/dev/null; done
declare -A res usr
# A and B swap places every round: the build measured second in a round ran about
# 5 % cheaper in user space and had the higher p99, whichever build it was.
for ((i=1;i<=R;i++)); do
  order="haproxy A B"; (( i % 2 == 0 )) && order="haproxy B A"
  for t in $order; do
    read cpu reqs p99 user < <(run $t); res[$t]+="$cpu "; usr[$t]+="$user "
    echo "r$i $t cpu/req=$cpu reqs=$reqs p99_us=$p99 user/req=$user"
  done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
ha=$(echo ${res[haproxy]} | med); a=$(echo ${res[A]} | med); b=$(echo ${res[B]} | med)
echo "MEDIAN $WLD haproxy=$ha A=$a B=$b  A/ha=$(awk -v x=$a -v y=$ha 'BEGIN{printf "%.2f", x/y}') B/ha=$(awk -v x=$b -v y=$ha 'BEGIN{printf "%.2f", x/y}') B/A=$(awk -v x=$b -v y=$a 'BEGIN{printf "%.2f", x/y}')"
ua=$(echo ${usr[A]} | med); ub=$(echo ${usr[B]} | med)
echo "MEDIAN $WLD user space: A=$ua B=$ub  B/A=$(awk -v x=$ub -v y=$ua 'BEGIN{printf "%.2f", x/y}')"
