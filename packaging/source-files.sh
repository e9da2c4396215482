#!/bin/sh
# The files `make deb` builds the package from, NUL-terminated, relative to the
# top of the tree: those git tracks and the untracked ones it does not ignore.
# Outside a git checkout (a release tarball, `git archive`) an empty repository
# of its own lists the same: every file that the tree's .gitignore does not ignore.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$top"
# safe.directory: root building someone else's checkout (git refuses it otherwise).
# The top must be this tree's own: a tarball unpacked inside another repository
# (a home kept in git) is not that repository's checkout.
if [ "$(git -c safe.directory="$top" rev-parse --show-toplevel 2>/dev/null)" = "$top" ]; then
    exec git -c safe.directory="$top" ls-files -z --cached --others --exclude-standard
fi
empty=$(mktemp -d)
trap 'rm -rf "$empty"' EXIT
git init -q "$empty"
git --git-dir="$empty/.git" --work-tree="$top" ls-files -z --others --exclude-standard
