# Sourced by the real-Moodle measures (surge.sh, quiz.sh): installs HAProxy from
# Debian's packages when this machine has none, as tests/moodle/deps.sh does PHP.
if ! command -v haproxy >/dev/null 2>&1; then
    echo "$(basename "$0"): installing haproxy"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y haproxy
fi
