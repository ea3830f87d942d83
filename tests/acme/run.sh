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
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

missing=()
for tool in pebble curl openssl; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]} (Debian's packages)"
    if [ "$(id -u)" -ne 0 ]; then
        echo "${missing[*]} missing, and installing needs root:" >&2
        echo "  sudo apt-get install -y pebble curl openssl" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if ! apt-get install -y -qq pebble curl openssl >/dev/null; then
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

# The certificate the gateway serves right now: its serial, checked against
# Pebble's root (curl fails on a certificate it does not trust).
served_serial() {
    curl -sS --fail --cacert "$work/pebble-root.pem" -o /dev/null "https://localhost:$tls_port/login/index.php" || return 1
    openssl s_client -connect "127.0.0.1:$tls_port" -servername localhost </dev/null 2>/dev/null \
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

run_challenge() { # challenge
    local challenge=$1
    acme_port=$(free_port) mgmt_port=$(free_port) http_port=$(free_port) tls_port=$(free_port)
    cat >"$work/pebble.json" <<EOF
{"pebble": {"listenAddress": "127.0.0.1:$acme_port", "managementListenAddress": "127.0.0.1:$mgmt_port",
 "certificate": "$work/pebble.pem", "privateKey": "$work/pebble.key",
 "httpPort": $http_port, "tlsPort": $tls_port, "ocspResponderURL": "", "externalAccountBindingRequired": false}}
EOF
    # No artificial sleep before validating; no nonce refused on purpose (instant-acme
    # retries those, but a run should not depend on it); no authorization reused, so
    # the renewal answers its challenge too.
    PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0 PEBBLE_AUTHZREUSE=0 pebble -config "$work/pebble.json" >"$work/pebble-$challenge.log" 2>&1 &
    local pebble=$!
    pids+=("$pebble")
    for _ in $(seq 50); do
        curl -s --cacert "$work/minica.pem" "https://localhost:$acme_port/dir" >/dev/null && break
        sleep 0.2
    done
    curl -sS --fail --cacert "$work/minica.pem" "https://localhost:$mgmt_port/roots/0" >"$work/pebble-root.pem" \
        || fail "pebble did not start"

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

echo "== pebble $(dpkg-query -W -f '${Version}' pebble 2>/dev/null || echo '(not from a package)')"
run_challenge http-01
run_challenge tls-alpn-01
echo "== ACME suite passed"
