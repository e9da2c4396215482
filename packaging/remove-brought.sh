#!/bin/sh
# Removes again the packages that install-deps.sh --record listed in FILE, those
# of them that nothing else installed needs: `make install` takes its build tools
# away once the .deb is installed, `make check-clean` what `make deps` brought.
# Those still needed (by nvshare, by what the admin installed since) stay, marked
# automatically installed, so that they go with what needs them (apt autoremove).
#   packaging/remove-brought.sh FILE
# Only if apt would remove exactly those and nothing else; otherwise they stay
# and it says so.
set -eu
export LC_ALL=C
list=${1:?usage: $0 FILE}
[ -s "$list" ] || exit 0
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# dpkg names Multi-Arch: same packages name:arch, apt's simulation may not.
names() { sed -e "s/:$arch\$//" -e 's/:all$//' -e '/^$/d' | sort -u; }
names <"$list" >"$work/listed"
dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' | awk '$1 == "ii" {print $2}' \
    | names >"$work/installed"
comm -12 "$work/listed" "$work/installed" >"$work/brought"
[ -s "$work/brought" ] || exit 0
# What nothing needs once every brought package counts as automatically
# installed: make deps installs what it names as manual (so that apt autoremove
# keeps make check's tools), which apt's autoremove never takes.  Asked of a
# copy of apt's marks, so nothing changes unless the removal goes ahead.  apt's
# own autoremove also keeps whatever any installed package merely recommends or
# suggests (apt suggests dpkg-dev, which recommends build-essential, ...): that
# would keep most build tools for good.
marks="$work/extended_states"
cp /var/lib/apt/extended_states "$marks" 2>/dev/null || : >"$marks"
# shellcheck disable=SC2046 # one package name a word
apt-mark -o Dir::State::extended_states="$marks" auto $(cat "$work/brought") >/dev/null
apt-get -s -o Dir::State::extended_states="$marks" -o APT::AutoRemove::RecommendsImportant=false \
    -o APT::AutoRemove::SuggestsImportant=false autoremove 2>/dev/null \
    | awk '$1 == "Remv" {print $2}' | names >"$work/unneeded"
comm -12 "$work/brought" "$work/unneeded" >"$work/remove"
comm -23 "$work/brought" "$work/remove" >"$work/needed"
if [ -s "$work/remove" ]; then
    # shellcheck disable=SC2046
    apt-get -s purge $(cat "$work/remove") 2>/dev/null | awk '$1 == "Purg" {print $2}' | names >"$work/would"
    if ! cmp -s "$work/remove" "$work/would"; then
        echo "nvshare: left the $(wc -l <"$work/brought") packages it had installed: removing them would also take" \
            "$(comm -13 "$work/remove" "$work/would" | tr '\n' ' ')and keep $(comm -23 "$work/remove" "$work/would" | tr '\n' ' ')"
        exit 0
    fi
    # shellcheck disable=SC2046
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $(cat "$work/remove") >/dev/null
fi
if [ -s "$work/needed" ]; then
    # shellcheck disable=SC2046
    apt-mark auto $(cat "$work/needed") >/dev/null
fi
kept=""
[ -s "$work/needed" ] && kept=" ($(wc -l <"$work/needed") kept: what is installed needs them)"
echo "nvshare: removed the $(wc -l <"$work/remove") packages it had installed$kept"
