#!/usr/bin/env bash
# Memory per idle keep-alive connection of the gateway, nginx and HAProxy in one run,
# plain HTTP/1.1 and over TLS: CONNS clients each open a connection, ask for a course
# page through the proxy, read the whole answer and then sit idle on the open
# connection, as a student reading a page before the next click. What each idle
# connection costs is the growth of the proxy's resident memory (VmRSS summed over
# its processes, from /proc) divided by CONNS, once it has settled. Kernel socket
# buffers are not in it, for any of the three.
#
#   bench/idle_memory.sh target/release/moodle-gateway      # ~3 min
#
# Each proxy starts afresh for each variant (plain, then TLS), so memory freed by one
# run cannot serve the next. TLS as lib/tls.sh sets it for all three (one
# self-signed ECDSA P-256 certificate, TLS 1.3), ALPN http/1.1 only, every
# connection a full handshake. The idle timeouts are raised to 300 s for all
# three so that no connection closes during the run; the client counts the
# connections still open at the end, and a proxy that closed some is flagged.
# nginx runs with `keepalive_timeout` and nothing else changed: its small
# `client_header_buffer_size` (1k) is how it keeps an idle connection small.
#
# Connections come RATE a second. WARM connections come first, idle too, and are in
# "before": lazily made state (TLS caches, the allocator's arenas) and the connections
# kept to the nodes are not in the idle connections' share. The gateway gives a
# student's first request only a node connection that has been quiet for a second, so
# new connections open new ones until its pools hold about a second's worth (up to 256
# a node); the warm ones, at the same pace, grow them to that (its `upstream_idle` is
# raised to 300 s so that they stay). The "node conns" column counts each proxy's
# connections to the backends before and after the measured ones: a figure whose count
# grew carries some of those too.
#
# Knobs: CONNS [2000: the more, the less the allocator's own free pages weigh in each
# one's share], WARM [1200], RATE [300 connections a second], VARIANTS ["plain tls"], PROXIES_MEASURED ["gateway nginx
# haproxy"]; GATEWAY_CMD runs the gateway under a profiler (heaptrack, say).
set -uo pipefail
BIN=$(realpath "$1"); CONNS=${CONNS:-2000} WARM=${WARM:-1200} RATE=${RATE:-300}
VARIANTS=${VARIANTS:-"plain tls"}; PROXIES_MEASURED=${PROXIES_MEASURED:-"gateway nginx haproxy"}
export BENCH_PORT_BASE=${BENCH_PORT_BASE:-18800} PROXY_THREADS=1 BENCH_LOAD_TOOL=""
export BENCH_KEEPALIVE=300 BENCH_ALPN=http/1.1 GATEWAY_TIMEOUTS='upstream_idle = "300s"'
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib/stack.sh"
stack_init
export GATEWAY_CMD=${GATEWAY_CMD:-"$BIN --config \"\$GATEWAY_CONFIG\""}
start_backends 2>/dev/null

rss_kib() { # pid -> resident KiB of it and its descendants
    local total=0 p kib
    for p in $(pid_tree "$1"); do
        kib=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null) || continue
        total=$((total + ${kib:-0}))
    done
    echo "$total"
}

settle() { # pid -> the resident KiB once two readings 1 s apart agree within 0.5 %
    local last now i
    last=$(rss_kib "$1")
    for ((i = 0; i < 30; i++)); do
        sleep 1
        now=$(rss_kib "$1")
        [ $(( (now > last ? now - last : last - now) * 200 )) -le "$last" ] && break
        last=$now
    done
    echo "$now"
}

# start_proxy PROXY VARIANT: a fresh PROXY with its bench config, idle timeouts raised,
# TLS on its port for "tls" (lib/tls.sh); sets PID and PORT.
start_proxy() {
    local start=start_$1 tls=0
    [ "$1" = nginx ] && start=start_nginx_proxy
    [ "$2" = tls ] && tls=1
    PROXY_RUN=$2 BENCH_TLS=$tls "$start"
    PID=${PROXY_PID[$1]} PORT=${PROXY_PORT[$1]}
}

cat >"$WORK/idlers.py" <<'PY'
import socket, ssl, sys, time
port, tls, warm, n, rate = int(sys.argv[1]), sys.argv[2] == "tls", int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
request = (
    "GET /course/view.php?id=2 HTTP/1.1\r\nHost: localhost\r\n"
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n"
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
    "Accept-Language: en-GB,en;q=0.5\r\nAccept-Encoding: identity\r\n"
    # One session for every connection: the proxies' tables do not grow with them.
    "Cookie: MOODLEID1_=%25DF%25F9; MoodleSession=idlebench0000000000000000a\r\n\r\n"
).encode()
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
context.set_alpn_protocols(["http/1.1"])

def asking():
    """A new connection that has sent its request."""
    s = socket.create_connection(("127.0.0.1", port))
    if tls:
        s = context.wrap_socket(s, server_hostname="localhost")
    s.sendall(request)
    return s

def answered(s):
    """The connection once all of its answer is read; it stays open."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("closed before the answer")
        got += chunk
    head, body = got.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200"):
        sys.exit("answered %r" % head[:40])
    length = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
    left = int(length[0].split(b":")[1]) - len(body) if length else 0
    while left > 0:
        left -= len(s.recv(65536))
    return s

def paced(count):
    """`count` idle connections, one every 1/rate s."""
    start, made = time.monotonic(), []
    for i in range(count):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        made.append(answered(asking()))
    return made

held = paced(warm)
print("warm", flush=True)
sys.stdin.readline()
held += paced(n)
print("ready", flush=True)
sys.stdin.readline()
PY

established() { # filter -> TCP connections in that state matching the ss filter
    ss -Htn state established "$1" | wc -l
}

printf '%-8s %-6s %11s %11s %7s %11s %13s\n' proxy tls "before KiB" "after KiB" open "node conns" "KiB per conn"
for variant in $VARIANTS; do
    for proxy in $PROXIES_MEASURED; do
        start_proxy "$proxy" "$variant"
        out=$WORK/idlers-$proxy-$variant.out fifo=$WORK/idlers-$proxy-$variant
        mkfifo "$fifo"
        # The clients hold their sockets until told (a line on the fifo): "warm" once
        # the warm connections are idle, "ready" once all are.
        python3 "$WORK/idlers.py" "$PORT" "$variant" "$WARM" "$CONNS" "$RATE" <"$fifo" >"$out" 2>&1 &
        clients=$!
        exec 7>"$fifo"
        waited() { # word -> waits for it in the clients' output (or their end)
            until grep -q "$1" "$out" 2>/dev/null; do
                kill -0 "$clients" 2>/dev/null || { cat "$out" >&2; die "$proxy ($variant): the clients stopped"; }
                sleep 0.2
            done
        }
        waited warm
        before=$(settle "$PID")
        nodes_before=$(established "( dport >= :${WEB_PORTS[0]} and dport <= :$DATA_PORT )")
        echo >&7
        waited ready
        after=$(settle "$PID")
        open=$(established "( sport = :$PORT )")
        [ "$open" -eq $((WARM + CONNS)) ] || open="$open!"
        nodes=$(established "( dport >= :${WEB_PORTS[0]} and dport <= :$DATA_PORT )")
        echo >&7
        exec 7>&-
        wait "$clients"
        printf '%-8s %-6s %11d %11d %7s %11s %13s\n' "$proxy" "$variant" "$before" "$after" "$open" "$nodes_before-$nodes" \
            "$(awk -v a="$after" -v b="$before" -v n="$CONNS" 'BEGIN { printf "%.2f", (a - b) / n }')"
        stop_pid "$PID"
    done
done
