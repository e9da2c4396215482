#!/bin/sh
# `sudo make install` and `sudo make check` build in the checkout as root
# (build/, .venv, shim/build, tests/standin/build, __pycache__): hand whatever
# root made there back to the checkout's owner, so that their own `make clean`
# and the next build work.  Nothing to do when root owns the checkout.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
owner=$(stat -c %u:%g "$top")
[ "$(id -u)" = 0 ] && [ "${owner%%:*}" != 0 ] || exit 0
find "$top" -xdev -uid 0 -exec chown -h "$owner" {} +
