#!/usr/bin/env bash
# The quiz measure on real Moodle: 16 students are answering a timed quiz (a page
# turn every 1-2 s, an autosave every third turn), then a class of 120, logged in and
# on the quiz's page, clicks "Start attempt" within one second, answers its five
# pages and submits; on one site and four nodes with 2 PHP workers each, behind the
# gateway with [surge] max_active = 2 (also with each node's second, low-priority
# pool of 2 workers at nice 10 as its low_priority_url, each pool capped at 2),
# behind the gateway without a cap, and behind HAProxy with maxconn 2 per node and
# a priority class for attempts in progress. It prints, per side, the early students' page-turn times before, during and after the
# start wave, each class student's time from the click to the first question page,
# autosave failures, errors, lost sessions, and attempts created out of click order.
# Nothing is asserted about time. Release matters: the test's CARGO_BIN_EXE gateway
# follows the profile.
#
#   GATEWAY_BEFORE=/path/to/moodle-gateway bench/quiz.sh
#
# runs that binary first (with the cap, without and with the pools) beside this
# build: a before and after in one run (build it in another worktree with
# `cargo build --release`).
#
#   MEASURE_FRONTS=pools bench/quiz.sh
#
# measures only the rows whose name has "pools" in it; items split by | each
# name a row whole (that row alone) or a part of names:
#
#   MEASURE_FRONTS="gateway, max_active 2|gateway, max_active 2, the nodes' gates alone" bench/quiz.sh
#
#   MEASURE_SURGE_EXTRA='quiz_starts = 2\nquiz_starts_yield_at = 0' bench/quiz.sh
#
# adds those lines to the [surge] of this build's capped rows (not GATEWAY_BEFORE's),
# for an experiment; the table does not show them, so say them beside its figures
# (a row that already sets a key they name fails on the duplicate: pick rows).
#
#   MOODLE_NODE_CPU=0.35 bench/quiz.sh
#
# gives each web node 0.35 of a core of its own (a CPU cgroup; needs root): the four
# nodes otherwise share this machine's cores, so one node's starts slow every other
# node's page turns, which a site of separate servers does not see.
# Needs what tests/moodle/run.sh needs (it installs it when missing) and haproxy
# (installed here when missing). About ten minutes once built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tests/moodle/deps.sh

. bench/lib/haproxy.sh

exec cargo test --locked --release --test real_moodle measure_quiz -- --ignored --nocapture --test-threads=1 "$@"
