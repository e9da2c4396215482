#!/bin/sh
# Installs the Debian packages that the named lists (files in packaging/, one
# package a line) ask for, when any is missing.
#   packaging/install-deps.sh [--auto] [--record FILE] LIST...
# --auto: the packages this run installs are marked automatically installed
# (apt-mark auto), so that `apt autoremove` removes them once nothing needs
# them; those that were there before keep their mark.
# --record FILE: FILE lists the packages this run installed, one a line (empty
# when none): `make install` removes those again once the .deb is installed.
set -eu
here=$(dirname "$0")
auto=no
record=""
while [ $# -gt 0 ]; do
    case "$1" in
        --auto) auto=yes; shift ;;
        --record) record=${2:?--record needs a file}; shift 2 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--auto] [--record FILE] LIST..." >&2; exit 2; }
[ -z "$record" ] || : >"$record"
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
brought=$(dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' | awk '$1 == "ii" {print $2}' \
    | sort | comm -13 "$before" -)
[ -z "$record" ] || echo "$brought" >"$record"
if [ "$auto" = yes ]; then
    # shellcheck disable=SC2086 # one package name a word
    apt-mark auto $brought >/dev/null
fi
