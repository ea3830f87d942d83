#!/usr/bin/env bash
# Runs the real-Moodle suite (tests/real_moodle.rs): installs PHP and MariaDB when
# missing, then every test of the binary, ignored ones included. Extra arguments go to
# the test binary, e.g. `tests/moodle/run.sh --nocapture` or a test name filter.
# The first run installs Moodle once into target/real-moodle-cache/ (about two minutes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

tests/moodle/deps.sh

# Pending (#12): these two describe behaviour another change brings; they fail today.
# Remove each --skip when its change lands.
pending=(
    --skip check_refuses_node_local_sessions_with_scorm_on_a_moodle_data_server
    --skip the_shipped_config_with_only_addresses_changed_keeps_real_moodle_up
)
exec cargo test --locked --test real_moodle -- --include-ignored --test-threads=1 "${pending[@]}" "$@"
