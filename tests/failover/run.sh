#!/usr/bin/env bash
# Two gateway hosts, one floating address, students under load, the master killed:
# the keepalived recipe of the book's "Running several gateways", tested.
#
# Builds, as network namespaces on one bridge (everything on this machine):
#   mg-lan     the switch: bridge br0 and one port per host
#   mg-gw-a    gateway host A, 10.77.0.11, keepalived MASTER by priority (150)
#   mg-gw-b    gateway host B, 10.77.0.12, keepalived BACKUP (100)
#   mg-client  the students and the stand-in nodes, 10.77.0.30
# The site's address is 10.77.0.100, held by whichever keepalived is master. Then
# tests/failover.rs (run inside mg-client) starts the gateways and keepalived in
# their namespaces, logs students in, kills A's gateway (kill -9), brings it back,
# takes A's link down and up again, and prints per event: requests failed, seconds
# until the address answered again, students logged out (must be 0).
#
# Needs root (namespaces, keepalived); keepalived is installed with apt-get when
# missing. Where namespaces cannot be made (an unprivileged container), it says so
# and exits 0: the run is skipped, not failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

NS_A=mg-gw-a NS_B=mg-gw-b NS_CLIENT=mg-client NS_LAN=mg-lan
IP_A=10.77.0.11 IP_B=10.77.0.12 IP_CLIENT=10.77.0.30 VIP=10.77.0.100

skip() {
    echo "failover: SKIPPED: $*"
    exit 0
}

[ "$(id -u)" = 0 ] || skip "not root: network namespaces and keepalived need it"
command -v ip >/dev/null || skip "no ip(8) (iproute2)"
if ! ip netns add mg-probe 2>/dev/null; then
    skip "network namespaces cannot be made here"
fi
ip netns del mg-probe
if ! command -v keepalived >/dev/null; then
    echo "failover: installing keepalived"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq keepalived >/dev/null
fi

WORK=
cleanup() {
    for ns in $NS_A $NS_B $NS_CLIENT $NS_LAN; do
        # Whatever the test left running in a namespace goes with it.
        for pid in $(ip netns pids $ns 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del $ns 2>/dev/null || true
    done
    [ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
cleanup
WORK=$(mktemp -d /tmp/mg-failover.XXXXXX)
chmod 755 "$WORK"

ip netns add $NS_LAN
ip -n $NS_LAN link add br0 type bridge
ip -n $NS_LAN link set br0 up
host() { # host NS IP
    ip netns add "$1"
    ip link add eth0 netns "$1" type veth peer name "p-$1" netns $NS_LAN
    ip -n $NS_LAN link set "p-$1" master br0 up
    ip -n "$1" addr add "$2/24" dev eth0
    ip -n "$1" link set eth0 up
    ip -n "$1" link set lo up
}
host $NS_A $IP_A
host $NS_B $IP_B
host $NS_CLIENT $IP_CLIENT

echo "failover: building"
nice -n 19 cargo test --test failover --no-run -q 2>&1 | tail -3

echo "failover: running (about a minute)"
ip netns exec $NS_CLIENT env MG_NS_A=$NS_A MG_NS_B=$NS_B MG_IP_A=$IP_A MG_IP_B=$IP_B \
    MG_IP_CLIENT=$IP_CLIENT MG_VIP=$VIP MG_WORK="$WORK" \
    nice -n 19 cargo test --offline --test failover -q -- --ignored --nocapture --test-threads=1 || {
    for log in "$WORK"/*/*.log; do
        echo "---- $log (last lines)"
        tail -n 25 "$log"
    done
    exit 1
}
