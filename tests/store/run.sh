#!/usr/bin/env bash
# Runs the shared-store suite (tests/it/store.rs, and the dashboard's view of it):
# several gateways sharing one real redis-server, each test starting its own on a
# free loopback port. Installs Debian's redis-server when missing, checks that it
# starts and answers on a free port, then runs the `it` binary's ignored tests.
# Extra arguments go to the test binary, e.g. `tests/store/run.sh --nocapture`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    echo "== installing redis-server (Debian's package)"
    if [ "$(id -u)" -ne 0 ]; then
        echo "redis-server is missing, and installing needs root:" >&2
        echo "  sudo apt-get install -y redis-server" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq redis-server >/dev/null
fi

# One server on a free loopback port, as the tests start theirs: a machine where
# that fails says so here, before a dozen tests each time out on it.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
done
redis-cli -p "$port" ping | grep -q PONG || { echo "redis-server did not start:" >&2; cat "$dir/log" >&2; exit 1; }
echo "== $(redis-server --version | cut -d' ' -f1-3) answers on 127.0.0.1:$port"
kill "$pid"
wait "$pid" 2>/dev/null || true

cargo test --locked --test it store -- --ignored "$@"
