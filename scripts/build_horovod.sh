#!/usr/bin/env bash
# Build, cache and install the patched Horovod into PREFIX: what `make setup` (scripts/setup.sh)
# and binder/postBuild run. The recipe and its patches live in the package,
# hvd_magic/horovod_build/, so that `python -m hvd_magic.build_horovod` finds them in a pip
# install too; this is the repository's name for it, arguments passed on unchanged.
#
# Usage: scripts/build_horovod.sh PREFIX [stock] [--wheel-only]   (see that build.sh)
exec bash "$(dirname "$0")/../hvd_magic/horovod_build/build.sh" "$@"
