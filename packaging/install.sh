#!/bin/sh
# `make install`: installs the build tools that are missing (deps-build.txt),
# builds the .deb (its log in build/deb.log, shown only when the build fails),
# installs it with apt, removes the build tools it brought, and says what
# changed on the node (say-installed.sh).  What is left is nvshare and what it needs at run time:
# `apt purge nvshare` and `apt autoremove` then leave the node as it was.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
log=$top/build/deb.log
brought=$top/build/build-deps-brought.txt
mkdir -p "$top/build"
# Recorded (and marked automatic) even when this run stops half-way, so that the
# next one removes them too.
"$top/packaging/install-deps.sh" --auto --record "$brought" deps-build.txt
echo "nvshare: building the .deb (log: build/deb.log)"
if ! make -s -C "$top" deb >"$log" 2>&1; then
    tail -n 25 "$log" >&2
    # Nothing of nvshare is installed, so nothing of the build stays either
    # (make deps keeps the build tools, for mending the build).
    if "$top/packaging/remove-brought.sh" "$brought"; then
        rm -f "$brought"
    fi
    echo "nvshare: the .deb did not build; the whole log is $log" >&2
    exit 1
fi
deb=$(ls "$top"/build/nvshare_*_amd64.deb | tail -n 1)
# apt reads a local .deb as its own user (_apt), who may not enter the owner's
# home (Debian 12 makes it 0700), and apt then warns that it downloads
# "unsandboxed as root": hand it a copy from a folder anyone can read.
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
chmod 0755 "$staging"
cp "$deb" "$staging/"
chmod 0644 "$staging/$(basename "$deb")"
# HideAutoRemove: the build tools just marked automatic are no longer needed,
# which apt would list here at length; remove-brought.sh takes them away next.
# No recommends: what nvshare's dependencies merely recommend (shared-mime-info
# for GLib, ...) nvshare does not use, and they would hold on to build tools.
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o APT::Get::HideAutoRemove=1 "$staging/$(basename "$deb")"
# nvshare is installed by now: a removal that fails (apt's lock held by
# unattended-upgrades, say) is said, and the next make install tries again.
if "$top/packaging/remove-brought.sh" "$brought"; then
    rm -f "$brought"
else
    echo "nvshare: could not remove the build tools it installed (listed in $brought);" \
        "'sudo make install' again tries once more" >&2
fi

"$top/packaging/say-installed.sh"
