#!/bin/sh
# Removes again the packages that install-deps.sh --record listed in FILE, those
# of them that nothing installed needs: `make install` takes the build tools away
# once the .deb is installed, leaving the node as it was plus nvshare.
#   packaging/remove-brought.sh FILE
# Only if apt would remove exactly those and nothing else; otherwise they stay
# (marked automatic) and it says so.
set -eu
export LC_ALL=C
list=${1:?usage: $0 FILE}
[ -s "$list" ] || exit 0
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# dpkg names Multi-Arch: same packages name:arch, apt's simulation may not.
names() { sed -e "s/:$arch\$//" -e 's/:all$//' -e '/^$/d' | sort -u; }
names <"$list" >"$work/brought"
# What nothing depends on.  apt's own autoremove also keeps whatever any installed
# package merely recommends or suggests (apt suggests dpkg-dev, which recommends
# build-essential, ...): that would keep most build tools for good.
apt-get -s -o APT::AutoRemove::RecommendsImportant=false \
    -o APT::AutoRemove::SuggestsImportant=false autoremove 2>/dev/null \
    | awk '$1 == "Remv" {print $2}' | names >"$work/unneeded"
comm -12 "$work/brought" "$work/unneeded" >"$work/remove"
[ -s "$work/remove" ] || exit 0
# shellcheck disable=SC2046 # one package name a word
apt-get -s purge $(cat "$work/remove") 2>/dev/null | awk '$1 == "Purg" {print $2}' | names >"$work/would"
if ! cmp -s "$work/remove" "$work/would"; then
    echo "nvshare: left the $(wc -l <"$work/remove") build packages installed: removing them would also take" \
        "$(comm -13 "$work/remove" "$work/would" | tr '\n' ' ')and keep $(comm -23 "$work/remove" "$work/would" | tr '\n' ' ')"
    exit 0
fi
# shellcheck disable=SC2046
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $(cat "$work/remove") >/dev/null
echo "nvshare: removed the $(wc -l <"$work/remove") build packages it had installed"
