#!/bin/sh
# Installs the Debian packages that the named lists (files in packaging/, one
# package a line) ask for, when any is missing.
#   packaging/install-deps.sh [--auto] [--record FILE] LIST...
# --auto: the packages this run installs are marked automatically installed
# (apt-mark auto), so that `apt autoremove` removes them once nothing needs
# them; those that were there before keep their mark.
# --record FILE: FILE gets the packages this run installed added to it, one a
# line: `make install` removes those again once the .deb is installed (and only
# then deletes FILE, so a build that failed and is run again still knows them).
set -eu
export LC_ALL=C
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
# Every package dpkg knew before, installed or not quite (config files left,
# half-installed), by name alone: none of those is counted as brought, so none is
# ever removed again.  (By name alone: a package whose Multi-Arch changes in an
# upgrade here would otherwise look new.)
before=$(mktemp)
trap 'rm -f "$before"' EXIT
dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 !~ /^[up]n/ {print $2}' | sort -u >"$before"
apt-get update -qq
status=0
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null || status=$?
# What is installed now and was not before, also when the install stopped half-way.
brought=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${binary:Package}\n' \
    | awk '$1 == "ii" {print $2, $3}' | sort -k1,1 | join -v 1 - "$before" | cut -d' ' -f2)
if [ -n "$record" ] && [ -n "$brought" ]; then
    mkdir -p "$(dirname "$record")"
    { cat "$record" 2>/dev/null || true; echo "$brought"; } | sort -u >"$record.new"
    mv "$record.new" "$record"
fi
if [ "$auto" = yes ] && [ -n "$brought" ]; then
    # shellcheck disable=SC2086 # one package name a word
    apt-mark auto $brought >/dev/null
fi
exit $status
