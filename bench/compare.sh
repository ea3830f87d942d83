#!/usr/bin/env bash
# Side-by-side load comparison: moodle-gateway next to HAProxy and nginx doing the
# same job (round robin + stickiness learned from Set-Cookie + SCORM to the data
# server) in front of the same nginx backends, all on 127.0.0.1. Prints proxy CPU
# per request, req/s and p50/p99 as ratios against HAProxy measured in the same run.
#
#   bench/compare.sh                     # ~4.5 min, one proxy thread each
#   PROXY_THREADS=2 bench/compare.sh     # both cores
#   ROUNDS=5 WORKLOADS="W1 W4" bench/compare.sh
#
# Needs nginx, haproxy and wrk (Debian: apt-get install nginx-light haproxy wrk) and
# python3. Every knob of bench/run.sh (see bench/README.md) passes through.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for tool in nginx haproxy wrk python3; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "missing $tool: apt-get install nginx-light haproxy wrk python3" >&2
        exit 1
    }
done
cargo build --release --locked --bin moodle-gateway
# An absolute path: the gateway runs in its own scratch directory, so its state
# file (moodle-gateway.state, on by default) never carries one run's million
# sessions into the next.
export GATEWAY_CMD="$PWD/target/release/moodle-gateway --config \"\$GATEWAY_CONFIG\""
exec bench/run.sh
