#!/usr/bin/env bash
# Gateway CPU per request for one of Moodle's revisioned assets answered from the
# gateway's memory, against the same bytes proxied from a node, in one run. The node
# is nginx answering a 64 KiB stylesheet on two URLs: a revisioned theme/styles.php
# URL marked as Moodle marks it (public, max-age, immutable), which the gateway keeps,
# and the same URL at revision -1 (theme designer mode), which it always proxies.
# wrk drives each for a few seconds, interleaved, and the script prints the median
# gateway CPU per request (user + system, from /proc) of each and their ratio.
#
#   cargo build --release && bench/asset_cache.sh target/release/moodle-gateway
#
# Needs nginx and wrk (Debian: apt-get install nginx wrk). Knobs: ROUNDS [5], DUR [3]
# seconds per run, CONNS [16]. Everything listens on 127.0.0.1; nothing is left behind.
set -euo pipefail
BIN=$(realpath "${1:-target/release/moodle-gateway}")
ROUNDS=${ROUNDS:-5}; DUR=${DUR:-3}; CONNS=${CONNS:-16}
for tool in nginx wrk; do command -v $tool >/dev/null || { echo "missing $tool" >&2; exit 1; }; done
work=$(mktemp -d); pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
node=$(port); data=$(port); gw=$(port); admin=$(port)
head -c 65536 /dev/zero | tr '\0' 'a' > "$work/styles.css"
mkdir -p "$work/logs"
cat > "$work/nginx.conf" <<CONF
daemon off; worker_processes 1; pid $work/nginx.pid; error_log $work/logs/error.log;
events { worker_connections 1024; }
http {
  access_log off; client_body_temp_path $work; proxy_temp_path $work; fastcgi_temp_path $work;
  uwsgi_temp_path $work; scgi_temp_path $work;
  server {
    listen 127.0.0.1:$node; listen 127.0.0.1:$data; keepalive_requests 100000;
    location /theme/styles.php/ {
      default_type "text/css; charset=utf-8"; etag off;
      add_header Cache-Control "public, max-age=7776000, immutable";
      root $work; rewrite ^ /styles.css break;
    }
  }
}
CONF
nginx -c "$work/nginx.conf" & pids+=($!)
cat > "$work/config.toml" <<CONF
listen = "127.0.0.1:$gw"
state.file = ""
[admin]
listen = "127.0.0.1:$admin"
token = "asset-cache-bench-token-0123456789abcdef"
[session]
store = "shared"
[[nodes]]
name = "web1"
url = "http://127.0.0.1:$node"
[data]
name = "data"
url = "http://127.0.0.1:$data"
CONF
(cd "$work" && TOKIO_WORKER_THREADS=1 exec "$BIN" --config "$work/config.toml" > "$work/gateway.log" 2>&1) & gpid=$!; pids+=($gpid)
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$gw) 2>/dev/null && break; sleep 0.1; done
(echo > /dev/tcp/127.0.0.1/$gw) 2>/dev/null || { echo "the gateway did not start:" >&2; cat "$work/gateway.log" >&2; exit 1; }
cached="http://127.0.0.1:$gw/theme/styles.php/boost/1700000000/all"
proxied="http://127.0.0.1:$gw/theme/styles.php/boost/-1/all"
for url in "$cached" "$proxied"; do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url")" = 200 ] || { echo "$url: not 200" >&2; exit 1; }
done
ticks() { awk '{ print $14 + $15 }' /proc/$gpid/stat; }
run() { # url -> microseconds of gateway CPU per request
  local t0 t1 reqs
  t0=$(ticks)
  reqs=$(wrk -t1 -c"$CONNS" -d"${DUR}s" "$1" | awk '/requests in/ { print $1 }')
  t1=$(ticks)
  python3 -c "print(round(($t1 - $t0) * 1e6 / $(getconf CLK_TCK) / $reqs, 1))"
}
c=(); p=()
for _ in $(seq "$ROUNDS"); do c+=("$(run "$cached")"); p+=("$(run "$proxied")"); done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
mc=$(median "${c[@]}"); mp=$(median "${p[@]}")
hits=$(curl -s -H "Authorization: Bearer asset-cache-bench-token-0123456789abcdef" "http://127.0.0.1:$admin/cache")
echo "64 KiB stylesheet, $ROUNDS rounds of ${DUR}s, $CONNS connections, one gateway thread"
echo "  from memory: $mc us of gateway CPU per request (rounds: ${c[*]})"
echo "  proxied:     $mp us (rounds: ${p[*]})"
python3 -c "print('  memory / proxied: %.2f' % ($mc / $mp))"
echo "  /cache: $hits"
