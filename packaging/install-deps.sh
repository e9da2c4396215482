#!/bin/sh
# Installs the Debian packages that building nvshare and running its tests
# need, when any is missing.  One package a line in packaging/deps.txt.
set -eu
here=$(dirname "$0")
missing=""
for pkg in $(grep -v '^#' "$here/deps.txt"); do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing="$missing $pkg"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "nvshare: missing Debian packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
    exit 1
fi
echo "nvshare: installing$missing"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
