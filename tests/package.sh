#!/usr/bin/env bash
# The Debian package as an admin meets it: `cargo deb` builds it (with the book,
# docs/build.sh), `dpkg -i` installs it, `man moodle-gateway` opens its man page, the
# pages pass lexgrog and man --warnings, the
# book is in /usr/share/doc, the installed binary checks the installed config (also as the
# service's own user, who must be able to read the token), systemd-analyze
# verifies the unit and scores its hardening, `dpkg -r` removes the program but
# keeps the admin's files, and `dpkg --purge` removes those too.
#
# Needs root and dpkg (Debian or Ubuntu); installs cargo-deb (and, through
# docs/build.sh, mdbook) from crates.io and man-db from Debian when missing.
# systemd need not be running: the unit is verified, not started (the book's
# "Running it for real" has the manual test under systemd). Run by .ci/run after
# the tests; by hand: sudo tests/package.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PKG=moodle-gateway
UNIT=/usr/lib/systemd/system/$PKG.service
CONFIG=/etc/$PKG/config.toml
TOKEN=/etc/$PKG/admin.token
ROUTE_SECRET=/etc/$PKG/route.secret
# The most systemd-analyze security may score the unit (0 = fully sandboxed,
# 10 = not at all); the book's "Running it for real" states today's figure.
MAX_EXPOSURE=2.0

fail() { echo "tests/package.sh: FAILED: $*" >&2; exit 1; }
step() { echo "-- $*"; }

[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i)"
if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q installed; then
    fail "$PKG is installed on this machine already; not touching it"
fi
# Whatever happens below, leave the machine as it was.
trap 'dpkg --purge "$PKG" >/dev/null 2>&1 || true' EXIT

if ! cargo deb --version >/dev/null 2>&1; then
    step "cargo install --locked cargo-deb@3.8.0"
    cargo install --locked cargo-deb@3.8.0
fi

# The package ships the book: cargo deb refuses a missing asset.
step "docs/build.sh"
docs/build.sh

step "cargo deb --locked"
rm -rf target/debian
cargo deb --locked --output target/debian/
deb=$(ls target/debian/${PKG}_*.deb)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
[[ "$deb" == *"_${version}-"* ]] || fail "$deb is not version $version"

# Docker-style Debian images exclude manuals and docs from every package
# (path-exclude in /etc/dpkg/dpkg.cfg.d/); an admin's machine does not. Let ours in
# here, so that what is checked is what the package carries. dpkg reads its config
# files before the command line, and the last matching filter wins.
include=()
if grep -qs '^path-exclude.*/usr/share/\(man\|doc\)' /etc/dpkg/dpkg.cfg.d/*; then
    echo "-- dpkg excludes manuals or docs on this machine: including $PKG's for the test"
    include=(--path-include="/usr/share/man/man1/$PKG*" --path-include="/usr/share/doc/$PKG/*")
fi

step "dpkg -i $deb"
dpkg -i "${include[@]}" "$deb"
[ -x /usr/bin/$PKG ] || fail "no /usr/bin/$PKG"
/usr/bin/$PKG --version | grep -qx "$PKG $version" || fail "the binary is not $version"
dpkg-query -W -f='${Conffiles}\n' "$PKG" | grep -q " $CONFIG " || fail "$CONFIG is not a conffile"
dpkg-query -W -f='${Conffiles}\n' "$PKG" | grep -q " /etc/logrotate.d/$PKG " \
    || fail "/etc/logrotate.d/$PKG is not a conffile"
step "man $PKG, and the book"
if ! command -v man >/dev/null; then
    step "apt-get install man-db"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq man-db >/dev/null
fi
[ -f /usr/share/man/man1/$PKG.1.gz ] || fail "no /usr/share/man/man1/$PKG.1.gz"
# Read whole first, as below: grep -q would end man early under pipefail.
manual=$(MANPAGER=cat MANWIDTH=80 man $PKG 2>&1) || fail "man $PKG: $manual"
grep -q "moodle-gateway-check(1)" <<<"$manual" || fail "man $PKG does not list the commands"
grep -q "$version" <<<"$manual" || fail "man $PKG is not version $version"
MANPAGER=cat man $PKG-check >/dev/null 2>&1 || fail "man $PKG-check does not open"
# Every page as whatis reads it (lexgrog: a NAME line it can parse) and as groff
# renders it with every warning on (man --warnings): nothing may be said.
for page in /usr/share/man/man1/$PKG*.1.gz; do
    lexgrog "$page" >/dev/null || fail "lexgrog cannot read the NAME of $page"
    warnings=$(MANPAGER=cat MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null) \
        || fail "man --warnings -l $page: $warnings"
    [ -z "$warnings" ] || fail "man --warnings on $page: $warnings"
done
for page in index.html moodle.html troubleshooting.html; do
    [ -f /usr/share/doc/$PKG/book/$page ] || fail "no /usr/share/doc/$PKG/book/$page"
done

uid=$(id -u $PKG) || fail "no user $PKG"
[ "$uid" -lt 1000 ] || fail "user $PKG is not a system user (uid $uid)"
[ "$(stat -c '%a %U' $TOKEN)" = "600 $PKG" ] || fail "$TOKEN is $(stat -c '%a %U' $TOKEN)"
[ "$(head -1 $TOKEN | tr -d ' \n' | wc -c)" -ge 32 ] || fail "$TOKEN is shorter than 32 characters"
# The shipped config turns the route cookie on: its secret is made at install,
# like the token, so a crash right after a login still keeps the student home.
[ "$(stat -c '%a %U' $ROUTE_SECRET)" = "600 $PKG" ] || fail "$ROUTE_SECRET is $(stat -c '%a %U' $ROUTE_SECRET)"
[ "$(head -1 $ROUTE_SECRET | tr -d ' \n' | wc -c)" -ge 32 ] || fail "$ROUTE_SECRET is shorter than 32 bytes"
# Read whole first: `grep -q` stops at the match, and under pipefail the SIGPIPE
# that then ends `check` would fail the step.
checked=$(/usr/bin/$PKG check --config $CONFIG)
grep -q "^route cookie: MoodleGatewayRoute (secret: set, from route_cookie.secret_file" <<<"$checked" ||
    fail "the installed config does not use the installed route secret"

step "$PKG check on the installed config, as root and as $PKG"
/usr/bin/$PKG check --config $CONFIG
runuser -u $PKG -- /usr/bin/$PKG check --config $CONFIG >/dev/null ||
    fail "the service user cannot check $CONFIG"

# The unit's LimitNOFILE is the hard limit the gateway may raise itself to: it
# must cover what the shipped config needs, as check counts it.
limit=$(sed -n 's/^LimitNOFILE=//p' "$UNIT")
needed=$(/usr/bin/$PKG check --config $CONFIG | sed -n 's/^open files: \([0-9]*\) needed.*/\1/p')
echo "open files: the shipped config needs ${needed:-?}, the unit allows $limit"
[ -n "$needed" ] && [ "$needed" -le "$limit" ] ||
    fail "LimitNOFILE=$limit in $UNIT is below what $CONFIG needs (${needed:-unknown})"

# The shipped config's upload spool must be the directory the unit's sandbox
# lets the service write (CacheDirectory=); as the unit makes it, the service
# user can write there.
spool=$(sed -n 's/^spool_dir = "\(.*\)"$/\1/p' $CONFIG)
cache=$(sed -n 's/^CacheDirectory=//p' "$UNIT")
[ "$spool" = "/var/cache/$cache" ] ||
    fail "spool_dir \"$spool\" in $CONFIG is not the unit's CacheDirectory /var/cache/$cache"
install -d -m 0700 -o $PKG -g $PKG "$spool"
runuser -u $PKG -- sh -c "touch '$spool/probe' && rm '$spool/probe'" ||
    fail "the service user cannot write $spool"

if command -v systemd-analyze >/dev/null; then
    sockets=("${UNIT%.service}.socket" "${UNIT%.service}-admin.socket" "${UNIT%.service}-redirect.socket")
    step "systemd-analyze verify $UNIT ${sockets[*]}"
    systemd-analyze verify "$UNIT" "${sockets[@]}"
    # The sockets systemd holds must be the listeners the shipped config names,
    # each under the name the gateway looks for.
    socket_port=$(sed -n 's/^ListenStream=//p' "${sockets[0]}")
    grep -q "^listen = \"0.0.0.0:$socket_port\"" $CONFIG ||
        fail "ListenStream=$socket_port is not the shipped config's listen"
    admin_at=$(sed -n 's/^ListenStream=//p' "${sockets[1]}")
    sed -n '/^\[admin\]/,/^\[/p' $CONFIG | grep -q "^listen = \"$admin_at\"" ||
        fail "ListenStream=$admin_at in ${sockets[1]} is not the shipped config's [admin] listen"
    for pair in "0 public" "1 admin" "2 redirect"; do
        set -- $pair
        grep -qx "FileDescriptorName=$2" "${sockets[$1]}" || fail "${sockets[$1]} is not named $2"
        grep -qx "Service=$PKG.service" "${sockets[$1]}" || fail "${sockets[$1]} is not passed to $PKG.service"
    done
    grep -qx "Sockets=$PKG.socket $PKG-admin.socket" "$UNIT" ||
        fail "$UNIT does not take the students' and the admin's sockets"
    step "systemd-analyze security --offline=true $UNIT"
    exposure=$(systemd-analyze security --offline=true --no-pager "$UNIT" |
        sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
    echo "exposure: $exposure (at most $MAX_EXPOSURE)"
    awk -v e="$exposure" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e != "" && e <= m) }' ||
        fail "the unit's exposure ${exposure:-unknown} is above $MAX_EXPOSURE"
else
    echo "-- no systemd-analyze here: the unit is not verified"
fi

step "dpkg -r $PKG: the program goes, the admin's config, secrets and state stay"
mkdir -p /var/lib/$PKG && echo state >/var/lib/$PKG/$PKG.state
dpkg -r "$PKG"
[ ! -e /usr/bin/$PKG ] || fail "/usr/bin/$PKG is still there"
[ ! -e "$UNIT" ] || fail "$UNIT is still there"
[ ! -e /usr/share/man/man1/$PKG.1.gz ] || fail "the man page is still there"
[ -f $CONFIG ] || fail "dpkg -r removed the conffile $CONFIG"
[ -f $TOKEN ] || fail "dpkg -r removed $TOKEN"
[ -f $ROUTE_SECRET ] || fail "dpkg -r removed $ROUTE_SECRET"
[ -f /var/lib/$PKG/$PKG.state ] || fail "dpkg -r removed the state"
dpkg-query -W -f='${Status}\n' "$PKG" | grep -q "config-files" || fail "not in config-files state"

step "dpkg --purge $PKG: nothing of it is left"
dpkg --purge "$PKG"
for gone in $CONFIG $TOKEN $ROUTE_SECRET /etc/$PKG /var/lib/$PKG /var/cache/$PKG; do
    [ ! -e "$gone" ] || fail "$gone survived the purge"
done

echo "tests/package.sh: ok ($deb installs, checks, verifies, removes and purges)"
