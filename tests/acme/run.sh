#!/usr/bin/env bash
# Runs the ACME suite: the real gateway gets its certificate from Pebble (Debian's
# ACME test server, real validation, no shortcut), serves it to a client that trusts
# only Pebble's root, and renews it while that client keeps asking, with no failed
# request. Once with http-01 (the redirect listener answers the CA), once with
# tls-alpn-01 (the TLS listener does). Installs pebble, curl and openssl from
# Debian's packages when missing; needs python3 for a stand-in node (a static file
# server). Everything listens on 127.0.0.1, on free ports.
#
# Pebble validates "localhost" on the ports its config names (httpPort, tlsPort):
# the gateway listens there.
#
# Then two gateways sharing one redis-server ([store] kind = "redis"): exactly one
# orders, both serve that certificate, Pebble's HTTP-01 check goes to the one that
# is NOT ordering (tests/acme/elsewhere.py stands on Pebble's httpPort for a name
# that points at both, and sends every check to whichever gateway does not hold the
# ordering lease), and a renewal forced on one reaches the other. Installs Debian's
# redis-server when missing, as tests/store/run.sh does.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

missing=()
for tool in pebble curl openssl redis-server redis-cli; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]} (Debian's packages)"
    if [ "$(id -u)" -ne 0 ]; then
        echo "${missing[*]} missing, and installing needs root:" >&2
        echo "  sudo apt-get install -y pebble curl openssl redis-server" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if ! apt-get install -y -qq pebble curl openssl redis-server >/dev/null; then
        echo "SKIPPED: the ACME suite needs Debian's pebble package, which this machine cannot install" >&2
        exit 0
    fi
fi
command -v python3 >/dev/null || { echo "the ACME suite needs python3 (a stand-in node)" >&2; exit 1; }

cargo build --locked --quiet
gateway=$PWD/target/debug/moodle-gateway
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

fail() {
    echo "FAILED: $*" >&2
    for log in "$work"/*.log; do echo "--- $log" >&2; tail -n 30 "$log" >&2; done
    exit 1
}

# Pebble's own HTTPS (its directory) needs a certificate: a throwaway CA for it.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=pebble directory CA" -keyout "$work/minica.key" -out "$work/minica.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
    -keyout "$work/pebble.key" -out "$work/pebble.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$work/san.ext"
openssl x509 -req -in "$work/pebble.csr" -CA "$work/minica.pem" -CAkey "$work/minica.key" \
    -CAcreateserial -days 2 -extfile "$work/san.ext" -out "$work/pebble.pem" 2>/dev/null

# A stand-in PHP node and data server: a static file server with the file the
# health probe asks for (/theme/image.php) and a page.
mkdir -p "$work/site/theme" "$work/site/login"
echo favicon >"$work/site/theme/image.php"
echo "a Moodle page" >"$work/site/login/index.php"
node_port=$(free_port) data_port=$(free_port)
for port in "$node_port" "$data_port"; do
    (cd "$work/site" && exec python3 -m http.server --bind 127.0.0.1 "$port") >"$work/node-$port.log" 2>&1 &
    pids+=($!)
done

# The certificate the gateway on port $1 (default: $tls_port) serves right now: its
# serial, checked against Pebble's root (curl fails on a certificate it does not
# trust).
served_serial() {
    local port=${1:-$tls_port}
    curl -sS --fail --cacert "$work/pebble-root.pem" -o /dev/null "https://localhost:$port/login/index.php" || return 1
    openssl s_client -connect "127.0.0.1:$port" -servername localhost </dev/null 2>/dev/null \
        | openssl x509 -noout -serial 2>/dev/null | cut -d= -f2
}

write_config() { # challenge renew_before
    local redirect=""
    [ "$1" = http-01 ] && redirect="redirect_listen = \"127.0.0.1:$http_port\""
    cat >"$work/gateway.toml" <<EOF
listen = "127.0.0.1:$tls_port"

[site]
wwwroot = "https://localhost:$tls_port"

[session]
store = "shared"

[state]
file = ""

[tls]
$redirect

[acme]
directory = "https://localhost:$acme_port/dir"
directory_ca = "$work/minica.pem"
domains = ["localhost"]
contact = "moodle-admin@school.example"
challenge = "$1"
dir = "$work/acme-$1"
renew_before = "$2"

[[nodes]]
name = "web1"
url = "http://127.0.0.1:$node_port"

[data]
name = "data"
url = "http://127.0.0.1:$data_port"
EOF
}

# Pebble on free ports, validating HTTP-01 on $http_port and TLS-ALPN-01 on
# $tls_port; its log is $work/pebble-$1.log, its pid $pebble.
start_pebble() { # log name
    acme_port=$(free_port) mgmt_port=$(free_port)
    cat >"$work/pebble.json" <<EOF
{"pebble": {"listenAddress": "127.0.0.1:$acme_port", "managementListenAddress": "127.0.0.1:$mgmt_port",
 "certificate": "$work/pebble.pem", "privateKey": "$work/pebble.key",
 "httpPort": $http_port, "tlsPort": $tls_port, "ocspResponderURL": "", "externalAccountBindingRequired": false}}
EOF
    # No artificial sleep before validating; no nonce refused on purpose (instant-acme
    # retries those, but a run should not depend on it); no authorization reused, so
    # the renewal answers its challenge too.
    PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0 PEBBLE_AUTHZREUSE=0 pebble -config "$work/pebble.json" >"$work/pebble-$1.log" 2>&1 &
    pebble=$!
    pids+=("$pebble")
    for _ in $(seq 50); do
        curl -s --cacert "$work/minica.pem" "https://localhost:$acme_port/dir" >/dev/null && break
        sleep 0.2
    done
    curl -sS --fail --cacert "$work/minica.pem" "https://localhost:$mgmt_port/roots/0" >"$work/pebble-root.pem" \
        || fail "pebble did not start"
}

run_challenge() { # challenge
    local challenge=$1
    http_port=$(free_port) tls_port=$(free_port)
    start_pebble "$challenge"

    # Pebble's certificates live five years: renewing a day before is months away.
    write_config "$challenge" 1d
    "$gateway" check --config "$work/gateway.toml" >"$work/check-$challenge.log" 2>&1 \
        || fail "check refused the config"
    grep -q "acme: " "$work/check-$challenge.log" || fail "check does not say what ACME will do"
    "$gateway" run --config "$work/gateway.toml" >"$work/gateway-$challenge.log" 2>&1 &
    local gw=$!
    pids+=("$gw")

    local first=""
    for _ in $(seq 100); do
        first=$(served_serial) && [ -n "$first" ] && break
        sleep 0.3
    done
    [ -n "$first" ] || fail "$challenge: no certificate from pebble served"
    echo "== $challenge: issued by pebble and served (serial $first)"

    # A student who keeps asking while the certificate is renewed.
    local stop="$work/stop" count="$work/count"
    rm -f "$stop"
    (
        ok=0 failed=0
        while [ ! -e "$stop" ]; do
            if curl -sS --fail --cacert "$work/pebble-root.pem" -o /dev/null "https://localhost:$tls_port/login/index.php" 2>>"$work/client.log"; then
                ok=$((ok + 1))
            else
                failed=$((failed + 1))
            fi
        done
        echo "$ok $failed" >"$count"
    ) &
    local client=$!

    # Renewal forced the way an admin would: renew_before longer than what is
    # left, and a reload.
    write_config "$challenge" 3650d
    kill -HUP "$gw"
    local second=""
    for _ in $(seq 100); do
        second=$(served_serial) || true
        [ -n "$second" ] && [ "$second" != "$first" ] && break
        sleep 0.3
    done
    sleep 1
    touch "$stop"
    wait "$client"
    read -r ok failed <"$count"
    [ -n "$second" ] && [ "$second" != "$first" ] || fail "$challenge: the certificate was not renewed"
    [ "$failed" -eq 0 ] || fail "$challenge: $failed of $((ok + failed)) requests failed during the renewal"
    [ "$ok" -gt 0 ] || fail "$challenge: no request made during the renewal"
    grep -q "new TLS certificate served" "$work/gateway-$challenge.log" || fail "$challenge: no renewal logged"
    echo "== $challenge: renewed (serial $second), $ok requests during the renewal, none failed"

    kill "$gw" "$pebble"
    wait "$gw" "$pebble" 2>/dev/null || true
}

# Two gateways of one site sharing $redis_port; gateway $1 serves TLS on port $2
# and redirects (and answers HTTP-01) on $3; a renewal $4 before expiry.
write_shared_config() { # name tls_port redirect_port renew_before
    cat >"$work/$1.toml" <<EOF
listen = "127.0.0.1:$2"

[site]
wwwroot = "https://localhost:$2"

[session]
store = "shared"

[state]
file = ""

[store]
kind = "redis"
url = "redis://127.0.0.1:$redis_port"
name = "$1"
secret = "the site's store secret, the same on both gateways"

[tls]
redirect_listen = "127.0.0.1:$3"

[acme]
directory = "https://localhost:$acme_port/dir"
directory_ca = "$work/minica.pem"
domains = ["localhost"]
challenge = "http-01"
dir = "$work/acme-$1"
renew_before = "$4"

[[nodes]]
name = "web1"
url = "http://127.0.0.1:$node_port"

[data]
name = "data"
url = "http://127.0.0.1:$data_port"
EOF
}

# Both gateways' serials once both serve one Pebble issued, the same; empty when
# they do not within 30 s. $1: a serial both must have moved past.
same_serial_on_both() { # [old serial]
    local a="" b=""
    for _ in $(seq 100); do
        a=$(served_serial "$tls_a" 2>/dev/null) || a=""
        b=$(served_serial "$tls_b" 2>/dev/null) || b=""
        if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "${1:-}" ]; then
            echo "$a"
            return
        fi
        sleep 0.3
    done
}

run_shared() {
    redis_port=$(free_port)
    mkdir -p "$work/redis"
    redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no --dir "$work/redis" >"$work/redis.log" 2>&1 &
    redis_pid=$!
    pids+=("$redis_pid")
    for _ in $(seq 50); do
        redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG && break
        sleep 0.1
    done
    # Pebble checks HTTP-01 on $http_port, where elsewhere.py sends it to the
    # gateway that is not ordering.
    http_port=$(free_port) tls_port=$(free_port)
    start_pebble shared
    local tls_a tls_b redirect_a redirect_b
    tls_a=$(free_port) tls_b=$(free_port) redirect_a=$(free_port) redirect_b=$(free_port)
    python3 tests/acme/elsewhere.py "$http_port" "$redis_port" "moodle-gateway:acme:lease" \
        "gw-a=$redirect_a" "gw-b=$redirect_b" >"$work/elsewhere.log" 2>&1 &
    pids+=($!)
    write_shared_config gw-a "$tls_a" "$redirect_a" 1d
    write_shared_config gw-b "$tls_b" "$redirect_b" 1d
    "$gateway" check --config "$work/gw-a.toml" >"$work/check-shared.log" 2>&1 || fail "check refused the shared config"
    grep -q "acme: .*shared through Redis" "$work/check-shared.log" || fail "check does not say the certificate is shared"
    local gw_a gw_b
    "$gateway" run --config "$work/gw-a.toml" >"$work/gateway-gw-a.log" 2>&1 &
    gw_a=$!
    "$gateway" run --config "$work/gw-b.toml" >"$work/gateway-gw-b.log" 2>&1 &
    gw_b=$!
    pids+=("$gw_a" "$gw_b")
    local started=$SECONDS

    local first
    first=$(same_serial_on_both)
    [ -n "$first" ] || fail "shared: the two gateways do not serve one certificate from pebble"
    local orderers
    orderers=$(grep -l "renewing the TLS certificate by ACME" "$work"/gateway-gw-*.log | wc -l)
    [ "$orderers" -eq 1 ] || fail "shared: $orderers gateways ordered, not one"
    local issued
    issued=$(grep -c "Issued certificate serial" "$work/pebble-shared.log")
    [ "$issued" -eq 1 ] || fail "shared: pebble issued $issued certificates, not one"
    local orderer other
    orderer=$(grep -l "renewing the TLS certificate by ACME" "$work"/gateway-gw-*.log | sed 's/.*gateway-\(gw-.\)\.log/\1/')
    other=$([ "$orderer" = gw-a ] && echo gw-b || echo gw-a)
    grep -q "CA's request sent to $other while $orderer orders" "$work/elsewhere.log" \
        || fail "shared: pebble's HTTP-01 check did not go to the gateway that did not order"
    grep -q "refused" "$work/elsewhere.log" && fail "shared: a check of pebble's went nowhere"
    echo "== shared: $orderer ordered alone, $other answered pebble's HTTP-01 check, both serve serial $first ($((SECONDS - started)) s after their start)"

    # A renewal forced on the other gateway, as an admin would there: it orders
    # now, and its certificate reaches the first within its look at Redis (15 s).
    write_shared_config "$other" "$([ "$other" = gw-a ] && echo "$tls_a" || echo "$tls_b")" \
        "$([ "$other" = gw-a ] && echo "$redirect_a" || echo "$redirect_b")" 3650d
    kill -HUP "$([ "$other" = gw-a ] && echo "$gw_a" || echo "$gw_b")"
    started=$SECONDS
    local second=""
    for _ in 1 2; do
        second=$(same_serial_on_both "$first")
        [ -n "$second" ] && break
    done
    [ -n "$second" ] || fail "shared: the renewal by $other did not reach $orderer"
    issued=$(grep -c "Issued certificate serial" "$work/pebble-shared.log")
    [ "$issued" -eq 2 ] || fail "shared: pebble issued $issued certificates for one renewal"
    grep -q "CA's request sent to $orderer while $other orders" "$work/elsewhere.log" \
        || fail "shared: the renewal's check did not go to the gateway that did not order"
    grep -q "the site's TLS certificate, from Redis, served" "$work/gateway-$orderer.log" \
        || fail "shared: $orderer did not log the certificate it took from Redis"
    echo "== shared: $other renewed (serial $second), $orderer serves it too ($((SECONDS - started)) s after the reload)"

    # Redis gone, and the first gateway restarted meanwhile: it serves what its
    # acme.dir holds, the site's certificate.
    kill "$redis_pid" "$gw_a"
    wait "$redis_pid" "$gw_a" 2>/dev/null || true
    "$gateway" run --config "$work/gw-a.toml" >"$work/gateway-gw-a-again.log" 2>&1 &
    gw_a=$!
    pids+=("$gw_a")
    local again=""
    for _ in $(seq 100); do
        again=$(served_serial "$tls_a" 2>/dev/null) && [ -n "$again" ] && break
        sleep 0.3
    done
    [ "$again" = "$second" ] || fail "shared: restarted with Redis away, gw-a serves '$again', not the site's $second"
    echo "== shared: gw-a restarted with Redis away serves the site's certificate from its acme.dir"
    kill "$gw_a" "$gw_b" "$pebble"
    wait "$gw_a" "$gw_b" "$pebble" 2>/dev/null || true
}

echo "== pebble $(dpkg-query -W -f '${Version}' pebble 2>/dev/null || echo '(not from a package)')"
run_challenge http-01
run_challenge tls-alpn-01
run_shared
echo "== ACME suite passed"
