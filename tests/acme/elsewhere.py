#!/usr/bin/env python3
"""The address Pebble checks HTTP-01 at, standing for a Moodle name that points at
several gateways (DNS round-robin, or an address keepalived moved): every connection
goes to a gateway that is NOT ordering, i.e. not the one whose id is in the ordering
lease in Redis, so the CA's answer can only come through Redis. Each connection is
logged as "CA's request sent to B while A orders".

Usage: elsewhere.py LISTEN_PORT REDIS_PORT LEASE_KEY NAME=REDIRECT_PORT...
"""
import socket
import subprocess
import sys
import threading
import time

listen_port, redis_port, lease_key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
gateways = dict(arg.split("=", 1) for arg in sys.argv[4:])


def ordering():
    """The gateway holding the lease ("gw-a/1f2e3d4c" is gateway gw-a), or ""."""
    lease = subprocess.run(
        ["redis-cli", "-p", redis_port, "--raw", "GET", lease_key],
        capture_output=True, text=True, check=False,
    ).stdout.strip()
    return lease.split("/", 1)[0]


def pipe(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(client):
    orderer = ordering()
    others = [name for name in gateways if name != orderer]
    if orderer not in gateways or len(others) != 1:
        print(f"refused: no gateway orders now (lease {orderer!r})", flush=True)
        client.close()
        return
    target = others[0]
    upstream = None
    for _ in range(100):
        try:
            upstream = socket.create_connection(("127.0.0.1", int(gateways[target])))
            break
        except OSError:
            time.sleep(0.1)
    if upstream is None:
        print(f"refused: {target} does not listen", flush=True)
        client.close()
        return
    print(f"CA's request sent to {target} while {orderer} orders", flush=True)
    back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
    back.start()
    pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", listen_port))
server.listen(16)
while True:
    connection, _ = server.accept()
    threading.Thread(target=serve, args=(connection,), daemon=True).start()
