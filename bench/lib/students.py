#!/usr/bin/env python3
"""Students with think time over TLS, for bench/tls.sh (stdlib only).

  run URL IDS N CLICKS THINK SEED   N students, each clicking CLICKS times about THINK s
                                    apart; prints one JSON line of counts
  report FILE                       the table of tls.sh's "students" mode from the JSON
                                    lines (each with proxy, round and cpu_ticks added)

A student is one thread with one connection, kept between clicks as a browser keeps
it. Before a click it looks whether the proxy has closed the connection meanwhile (a
browser notices the FIN the same way) and then opens a new one, offering the TLS
session it got on the last one (Python's `ssl`, `session=`): the proxy resumes it or
makes a full handshake, which `session_reused` tells. A click whose kept connection
dies under it is sent once more on a new connection, as a browser retries a GET.
Each student starts at a random moment within the first THINK seconds and waits
THINK x 0.75-1.25 after each answer; the schedule comes from SEED, so every proxy is
offered the same one.
"""
import http.client
import json
import random
import select
import socket
import ssl
import statistics
import sys
import threading
import time

REQUEST = (
    "GET /course/view.php?id=2 HTTP/1.1\r\nHost: localhost\r\n"
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n"
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
    "Accept-Language: en-GB,en;q=0.5\r\nAccept-Encoding: identity\r\n"
    "Cookie: MOODLEID1_=%%25F1%%25CB%%252B; MoodleSession=%s\r\n\r\n"
)

COUNTS = ("clicks", "answered", "errors", "connections", "full", "resumed", "offered",
          "closed_idle", "retried")


class Student:
    """One browser: a kept connection, the last TLS session, and what happened."""

    def __init__(self, host, port, context, session_id):
        self.address = (host, port)
        self.context = context
        self.request = (REQUEST % session_id).encode()
        self.sock = None
        self.session = None
        self.n = dict.fromkeys(COUNTS, 0)

    def connect(self):
        raw = socket.create_connection(self.address, timeout=30)
        try:
            self.sock = self.context.wrap_socket(raw, server_hostname="localhost", session=self.session)
        except (OSError, ssl.SSLError):
            raw.close()
            raise
        self.n["connections"] += 1
        if self.session is not None:
            self.n["offered"] += 1
        self.n["resumed" if self.sock.session_reused else "full"] += 1

    def closed_meanwhile(self):
        """Whether the proxy closed the kept connection while the student read (its
        close_notify, a FIN or a reset waits on the socket). A late TLS 1.3 ticket is
        also something to read, and leaves the connection open."""
        waiting = select.poll()  # not select(): a thousand students pass fd 1024
        waiting.register(self.sock, select.POLLIN)
        if not waiting.poll(0):
            return False
        self.sock.setblocking(False)
        try:
            self.sock.recv(1)
            return True  # the end, or a byte no request asked for
        except ssl.SSLWantReadError:
            return False
        except (OSError, ssl.SSLError):
            return True
        finally:
            self.sock.settimeout(30)

    def drop(self):
        try:
            self.sock.close()
        except OSError:
            pass
        self.sock = None

    def ask(self):
        """One request and its whole answer on the current connection; the TLS session
        is kept once an answer came (TLS 1.3 tickets arrive after the handshake)."""
        self.sock.sendall(self.request)
        response = http.client.HTTPResponse(self.sock)
        response.begin()
        response.read()
        if response.status != 200:
            raise http.client.HTTPException("status %d" % response.status)
        self.session = self.sock.session
        if response.will_close:
            self.drop()

    def click(self):
        self.n["clicks"] += 1
        if self.sock is not None and self.closed_meanwhile():
            self.n["closed_idle"] += 1
            self.drop()
        for attempt in (1, 2):
            kept = self.sock is not None
            try:
                if not kept:
                    self.connect()
                self.ask()
                self.n["answered"] += 1
                return
            except (OSError, ssl.SSLError, http.client.HTTPException):
                if self.sock is not None:
                    self.drop()
                if not kept or attempt == 2:
                    self.n["errors"] += 1
                    return
                self.n["retried"] += 1

    def live(self, start, gaps):
        time.sleep(max(0.0, start - time.monotonic()))
        for gap in gaps:
            self.click()
            if gap is not None:
                time.sleep(gap)
        if self.sock is not None:
            self.drop()


def run(url, ids_path, n, clicks, think, seed):
    n, clicks, think = int(n), int(clicks), float(think)
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    ids = [line.strip() for line in open(ids_path) if line.strip()]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    draw = random.Random(int(seed))
    threading.stack_size(256 * 1024)
    begin = time.monotonic() + 0.5
    students, threads = [], []
    for i in range(n):
        student = Student(host, int(port), context, ids[i % len(ids)])
        gaps = [think * draw.uniform(0.75, 1.25) for _ in range(clicks - 1)] + [None]
        start = begin + draw.uniform(0, think)
        students.append(student)
        threads.append(threading.Thread(target=student.live, args=(start, gaps), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = {k: sum(s.n[k] for s in students) for k in COUNTS}
    out.update(students=n, clicks_each=clicks, think_s=think,
               wall_s=round(time.monotonic() - begin, 1))
    print(json.dumps(out))


def report(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    proxies = [p for p in ("gateway", "nginx", "haproxy") if any(r["proxy"] == p for r in rows)]
    rounds = sorted({r["round"] for r in rows})
    by = {(r["proxy"], r["round"]): r for r in rows}
    for r in rows:
        r["cpu_ms"] = r["cpu_ticks"] / r["clk_tck"] * 1000 / r["answered"] if r["answered"] else float("nan")

    def median(proxy, f):
        xs = [f(by[(proxy, k)]) for k in rounds if (proxy, k) in by]
        return statistics.median(xs) if xs else float("nan")

    def ratio(proxy, anchor):
        xs = [by[(proxy, k)]["cpu_ms"] / by[(anchor, k)]["cpu_ms"] for k in rounds
              if (proxy, k) in by and (anchor, k) in by and by[(anchor, k)]["cpu_ms"]]
        return "%.2f" % statistics.median(xs) if xs else "-"

    def resumed_share(r):
        return 100.0 * r["resumed"] / r["offered"] if r["offered"] else float("nan")

    def num(x, fmt):
        return "-" if x != x else fmt % x

    first = rows[0]
    names = {"gateway": "gateway", "nginx": "nginx", "haproxy": "HAProxy"}
    print("| median of %d round%s | %s |" % (len(rounds), "" if len(rounds) == 1 else "s",
                                            " | ".join(names[p] for p in proxies)))
    print("| --- |" + " --: |" * len(proxies))
    lines = [
        ("clicks answered (of %d)" % first["clicks"], lambda p: num(median(p, lambda r: r["answered"]), "%.0f")),
        ("new connections per click", lambda p: num(median(p, lambda r: r["connections"] / r["clicks"]), "%.2f")),
        ("full TLS handshakes", lambda p: num(median(p, lambda r: r["full"]), "%.0f")),
        ("resumed handshakes", lambda p: num(median(p, lambda r: r["resumed"]), "%.0f")),
        ("reconnects that resumed", lambda p: num(median(p, resumed_share), "%.0f %%")),
        ("closed while the student read", lambda p: num(median(p, lambda r: r["closed_idle"]), "%.0f")),
        ("retried on a new connection", lambda p: num(median(p, lambda r: r["retried"]), "%.0f")),
        ("errors", lambda p: num(median(p, lambda r: r["errors"]), "%.0f")),
        ("proxy CPU per click", lambda p: num(median(p, lambda r: r["cpu_ms"]), "%.3f ms")),
        ("CPU per click / nginx's", lambda p: ratio(p, "nginx")),
        ("CPU per click / HAProxy's", lambda p: ratio(p, "haproxy")),
    ]
    for title, cell in lines:
        print("| %s | %s |" % (title, " | ".join(cell(p) for p in proxies)))
    print()
    print("%d students, %d clicks each, about %g s apart; keep-alive idle timeout %s s on every proxy; "
          "a run took %.0f-%.0f s." % (first["students"], first["clicks_each"], first["think_s"],
                                     first.get("keepalive", "?"), min(r["wall_s"] for r in rows),
                                     max(r["wall_s"] for r in rows)))


def main(argv):
    if len(argv) >= 2 and argv[1] == "run" and len(argv) == 8:
        run(*argv[2:])
    elif len(argv) == 3 and argv[1] == "report":
        report(argv[2])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
