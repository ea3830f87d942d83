#!/usr/bin/env bash
# Installs what the real-Moodle suite needs (Debian 12 packages: PHP 8.2 with Moodle's
# extensions, MariaDB, nginx-light for the data server's file export of the offload
# mode, and redis-server for the gateways that share a store) when any of it is
# missing. Idempotent: with everything present it does nothing, and it runs
# `apt-get update` only when it has something to install.
set -euo pipefail

packages=(php-cli php-xml php-mbstring php-curl php-zip php-gd php-intl php-mysql mariadb-server nginx-light redis-server)
missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$package")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "deps.sh: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
$sudo apt-get update
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
