#!/bin/sh
# Installs the Debian packages that the named lists (files in packaging/, one
# package a line) ask for, when any is missing.
#   packaging/install-deps.sh [--auto] LIST...
# --auto: the packages this run installs are marked automatically installed
# (apt-mark auto), so that `apt autoremove` removes them once nothing needs
# them; those that were there before keep their mark.  `make install` uses it
# for the build tools: the .deb needs none of them at run time.
set -eu
here=$(dirname "$0")
auto=no
if [ "${1:-}" = --auto ]; then
    auto=yes
    shift
fi
[ $# -gt 0 ] || { echo "usage: $0 [--auto] LIST..." >&2; exit 2; }
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
# Everything installed before, to tell what this run brings (dependencies included).
before=$(mktemp)
trap 'rm -f "$before"' EXIT
dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' | awk '$1 == "ii" {print $2}' | sort >"$before"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
if [ "$auto" = yes ]; then
    brought=$(dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' | awk '$1 == "ii" {print $2}' \
        | sort | comm -13 "$before" -)
    # shellcheck disable=SC2086 # one package name a word
    apt-mark auto $brought >/dev/null
    echo "nvshare: $(echo "$brought" | wc -w) packages installed to build; marked automatic ('apt autoremove' removes them once nvshare is purged)"
fi
