#!/usr/bin/env bash
# Memory per slow reader of the gateway, nginx and HAProxy in one run: READERS
# clients each ask for a 1 GiB SCORM file through the proxy with a 4 KiB receive
# window and never read (slowhttptest -X). What each reader costs is the growth of
# the proxy's resident memory (all its processes) divided by READERS, once it has
# settled. Kernel socket buffers are not in it, for any of the three.
#
#   bench/slow_readers.sh target/release/moodle-gateway      # ~1 min
#
# nginx runs with its stock proxy buffers (proxy_buffer_size 4k, proxy_buffers 8 4k:
# ANCHOR_BUF_KB=4) and no temporary files, as a hardened nginx proxy would; HAProxy
# with tune.bufsize of the same 4 KiB. Knobs: READERS [400: the more readers, the
# less the allocator's own free pages weigh in each one's share], ANCHOR_BUF_KB [4];
# GATEWAY_CMD runs the gateway under a profiler (valgrind --tool=dhat, say).
set -uo pipefail
BIN=$(realpath "$1"); READERS=${READERS:-400}
export BENCH_PORT_BASE=${BENCH_PORT_BASE:-18700} PROXY_THREADS=1 ANCHOR_BUF_KB=${ANCHOR_BUF_KB:-4}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/lib/stack.sh"
stack_init
export GATEWAY_CMD=${GATEWAY_CMD:-"$BIN --config \"\$GATEWAY_CONFIG\""}
stack_start >/dev/null 2>&1
# Sparse: nginx's sendfile serves zeros without the disk holding a gigabyte.
truncate -s 1G "$WORK/data/pluginfile.php/42/mod_scorm/content/1/huge.bin"

rss_kib() { # pid -> resident KiB of it and its descendants
    local total=0 p kib
    for p in $(pid_tree "$1"); do
        kib=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null) || continue
        total=$((total + ${kib:-0}))
    done
    echo "$total"
}

cat >"$WORK/readers.py" <<'PY'
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
path = "/pluginfile.php/42/mod_scorm/content/1/huge.bin"
request = ("GET %s HTTP/1.1\r\nHost: localhost\r\nUser-Agent: slow-reader\r\n\r\n" % path).encode()
def reader():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(request)
    return s
held = [reader()]
print("warm", flush=True)
sys.stdin.readline()
held += [reader() for _ in range(n)]
print("ready", flush=True)
sys.stdin.readline()
PY

printf '%-8s %10s %10s %14s\n' proxy "before KiB" "after KiB" "KiB per reader"
for proxy in gateway nginx haproxy; do
    port=${PROXY_PORT[$proxy]} pid=${PROXY_PID[$proxy]}
    fifo=$WORK/readers-$proxy
    mkfifo "$fifo"
    # The readers hold their sockets open until told (a line on the fifo); they
    # report "ready" once every request is sent and a warm-up reader has settled.
    python3 "$WORK/readers.py" "$port" "$READERS" <"$fifo" >"$WORK/readers-$proxy.out" 2>&1 &
    readers=$!
    exec 7>"$fifo"
    settle() { # the resident KiB once two readings 1 s apart agree within 1 %
        local last now i
        last=$(rss_kib "$pid")
        for ((i = 0; i < 60; i++)); do
            sleep 1
            now=$(rss_kib "$pid")
            [ $(( (now > last ? now - last : last - now) * 100 )) -le "$last" ] && break
            last=$now
        done
        echo "$now"
    }
    until grep -q warm "$WORK/readers-$proxy.out" 2>/dev/null; do sleep 0.1; done
    before=$(settle)
    echo >&7
    until grep -q ready "$WORK/readers-$proxy.out" 2>/dev/null; do sleep 0.1; done
    after=$(settle)
    echo >&7
    exec 7>&-
    wait "$readers"
    printf '%-8s %10d %10d %14d\n' "$proxy" "$before" "$after" $(( (after - before) / READERS ))
done
