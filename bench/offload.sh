#!/usr/bin/env bash
# The offload measure on real Moodle: one student downloads a 50 MiB file resource
# through the gateway, served by PHP, then offloaded (X-Accel-Redirect, the bytes from
# the data server's nginx export), and it prints per download the PHP worker's time
# and the gateway's CPU per MiB, with the ratios offload/PHP. Nothing is asserted
# about time. Release matters: the test's CARGO_BIN_EXE gateway follows the profile.
# Needs what tests/moodle/run.sh needs (it installs it when missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tests/moodle/deps.sh

exec cargo test --locked --release --test real_moodle measure_offload -- --ignored --nocapture --test-threads=1 "$@"
