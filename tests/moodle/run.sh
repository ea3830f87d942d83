#!/usr/bin/env bash
# Runs the real-Moodle suite (tests/real_moodle.rs) on the Moodle tarball that
# MOODLE_TARBALL names (docs/src/moodle.md says which and how to make one; without it,
# ../shared/moodle/ beside the clone, as in CI). Installs PHP and MariaDB when
# missing, then every test of the binary, ignored ones included. Extra arguments go to
# the test binary, e.g. `tests/moodle/run.sh --nocapture` or a test name filter.
# The first run installs Moodle once into target/real-moodle-cache/ (about two minutes).
# The measures (measure_*) are not tests and stay out: bench/offload.sh runs them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

tests/moodle/deps.sh

exec cargo test --locked --test real_moodle -- --include-ignored --test-threads=1 --skip measure_ "$@"
