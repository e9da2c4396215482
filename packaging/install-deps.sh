#!/bin/sh
# Installs the Debian packages that the named lists (files in packaging/, one
# package a line; default deps.txt) ask for, when any is missing.
#   packaging/install-deps.sh [LIST...]
set -eu
here=$(dirname "$0")
[ $# -gt 0 ] || set -- deps.txt
missing=""
for list in "$@"; do
    for pkg in $(grep -v '^#' "$here/$list"); do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing="$missing $pkg"
    done
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "nvshare: missing Debian packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
    exit 1
fi
echo "nvshare: installing$missing"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
