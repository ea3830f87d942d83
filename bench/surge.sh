#!/usr/bin/env bash
# The surge measure on real Moodle: 12 logged-in students browse and save SCORM
# tracking, then 120 newcomers arrive within 2 s and log in, three times on one site
# and four nodes with 2 PHP workers each: behind the gateway with [surge]
# max_active = 2, behind the gateway without a cap, and behind HAProxy with
# maxconn 2 per node and a plain queue. It prints, per side, the students' answer
# times before and during the surge, the newcomers' time to log in, errors, students
# logged out, and the newcomers let in out of arrival order. Nothing is asserted
# about time. Release matters: the test's CARGO_BIN_EXE gateway follows the profile.
# SURGE_NEWCOMERS=280 runs a bigger morning instead: 280 newcomers within 3 s.
# GATEWAY_BEFORE=/path/to/moodle-gateway runs that build first, capped the same
# way: a before and after in one run (build it in another worktree).
# Needs what tests/moodle/run.sh needs (it installs it when missing) and haproxy
# (installed here when missing). About two minutes once built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tests/moodle/deps.sh

. bench/lib/haproxy.sh

exec cargo test --locked --release --test real_moodle measure_surge -- --ignored --nocapture --test-threads=1 "$@"
