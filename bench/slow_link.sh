#!/usr/bin/env bash
# The slow-link measure on real Moodle: a student's first visit (the login page, then
# the course page, each with the theme, JavaScript and images it links, as Chrome
# asks for them: six connections, gzip/br/zstd accepted) through the gateway with
# its compression off, then on. It prints the bytes received and the time for each
# page. Nothing is asserted about time. Release matters: the test's CARGO_BIN_EXE
# gateway follows the profile.
#
#   bench/slow_link.sh                       # 1 Mbit/s each way, 100 ms round trip
#   SLOW_LINK="2mbit 100ms" bench/slow_link.sh
#   SLOW_LINK= bench/slow_link.sh            # loopback: the bytes alone
#   ACCEPT_ENCODING=gzip bench/slow_link.sh  # one coding instead of Chrome's list
#
# The link is a relay inside the measure (tests/real_moodle/slow_link.rs says why
# not netem). Needs what tests/moodle/run.sh needs (it installs it when missing).
# About two minutes once built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tests/moodle/deps.sh

exec cargo test --locked --release --test real_moodle measure_slow_link -- --ignored --nocapture --test-threads=1 "$@"
