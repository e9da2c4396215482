#!/bin/sh
# An older distribution's root for tests/gpu/test_old_glibc_container.py: Debian
# bullseye (glibc 2.31, as Ubuntu 20.04's CUDA images) with old_glibc_client built
# inside it by its own gcc.  The GPU machine has no network, so this runs where
# debootstrap can reach a mirror (as root) and the tarball travels with the
# checkout (device tool: carry results/).
#
#     tests/gpu/make_old_glibc_root.sh results/bullseye-root.tar.xz
set -eu
out=$(realpath "${1:?usage: $0 OUT.tar.xz}")
here=$(cd "$(dirname "$0")" && pwd)
mirror=${NVSHARE_CI_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The build root has gcc; the root that travels does not (it stays under the carry limit).
debootstrap --variant=minbase --include=gcc,libc6-dev,make bullseye "$work/build" "$mirror" >/dev/null
debootstrap --variant=minbase bullseye "$work/root" "$mirror" >/dev/null
mkdir -p "$work/build/src/gpu"
cp "$here/old_glibc_client.c" "$work/build/src/gpu/"
cp -r "$here/../standin" "$work/build/src/standin"
rm -rf "$work/build/src/standin/build"
# Linked against the stand-in libcuda.so.1 (its exports are the driver's names); the
# driver's own libcuda.so.1 is bind-mounted into the container at run time.
chroot "$work/build" sh -c 'make -s -C /src/standin build/libcuda.so.1 build/libcuda.so &&
    cd /src/gpu && gcc -O2 -Wall -Wextra -std=gnu11 -o old_glibc_client old_glibc_client.c \
        -L/src/standin/build -lcuda'
install -D -m 0755 "$work/build/src/gpu/old_glibc_client" "$work/root/usr/local/bin/old_glibc_client"
mkdir -p "$work/root/run/nvshare" "$work/root/usr/lib/nvshare" "$work/root/usr/local/nvidia/lib64"
touch "$work/root/usr/lib/nvshare/libnvshare.so"
# What a container never reads at run time; the tarball must stay under the carry limit.
rm -rf "$work/root/var/cache/apt" "$work/root/var/lib/apt/lists" "$work/root/usr/share/doc" \
    "$work/root/usr/share/man" "$work/root/usr/share/locale" "$work/root/usr/share/info"
tar -C "$work/root" -cJf "$out" .
ls -l "$out"
