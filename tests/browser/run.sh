#!/usr/bin/env bash
# Runs the browser suite (tests/browser.rs): installs Debian's chromium and
# chromium-driver when missing, then the binary's tests, ignored ones included.
# Extra arguments go to the test binary, e.g. `tests/browser/run.sh --nocapture`.
# Screenshots land in target/screenshots/ (dashboard-desktop.png, dashboard-phone.png).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "== installing chromium and chromium-driver (Debian's packages)"
    if [ "$(id -u)" -ne 0 ]; then
        echo "chromium or chromedriver is missing, and installing needs root:" >&2
        echo "  sudo apt-get install -y chromium chromium-driver" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium chromium-driver >/dev/null
fi

exec cargo test --locked --test browser -- --include-ignored "$@"
