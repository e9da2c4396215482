#!/bin/sh
# The last screen of `make install`: what changed on the node, and what to run
# next, in commands that work here (a minimal Debian has no man).
set -eu
# Where the package put the shim (dpkg-architecture went with the build tools).
shim=$(dpkg -L nvshare | grep '/libnvshare\.so$' | head -n 1)
version=$(dpkg-query -W -f='${Version}' nvshare)
echo
echo "nvshare $version is installed."
if [ -d /run/systemd/system ]; then
    if [ "$(systemctl is-active nvshare.socket 2>/dev/null)" = active ]; then
        echo "  socket:  nvshare.socket listens on /run/nvshare/scheduler.sock; the agent starts with the first client"
    else
        echo "  socket:  nvshare.socket is not active: see 'systemctl status nvshare.socket'"
    fi
else
    echo "  socket:  systemd is not running here: nvshare.socket starts at the next boot"
fi
if /usr/lib/nvshare/preload-entry has "$shim"; then
    echo "  preload: /etc/ld.so.preload names $shim: every process started from now on loads it"
    echo "           (those already running do not); 'sudo nvsharectl preload disable' turns it off"
else
    echo "  preload: off ('sudo nvsharectl preload enable' turns it on)"
fi
# A minimal Debian has no man: name what works on this node.
if command -v man >/dev/null 2>&1; then
    manual="man nvsharectl"
else
    manual="nvsharectl --help; /usr/share/doc/nvshare/README.md"
fi
echo "  next:    nvsharectl status     (GPUs, holder, queue, clients; $manual)"
echo "           sudo make check       (the tests: needs the network; sudo make check-clean takes"
echo "                                  away what it installs; README.md says more)"
