#!/usr/bin/env bash
# `make lock`: the newest releases of everything the sandbox installs, tried on purpose.
#
# Sets up a venv of its own (.venv-newest; .venv is left as it is) with no lock, only
# requirements/caps.txt's caps, says which releases differ from requirements/lock.txt, runs the
# suite there, and rewrites the lock only if the suite passes. When it fails, the lock stays
# and the releases that changed are the suspects: fix what the new release broke, or cap it in
# requirements/caps.txt with the reason, and run this again.
#
# Usage: scripts/refresh_lock.sh [pytest arguments]   (e.g. -k gpus to try one part first)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
venv="$here/.venv-newest"
new="$venv/lock.txt"
rm -rf "$venv"
HVD_MAGIC_VENV="$venv" HVD_MAGIC_LOCK=none bash scripts/setup.sh
"$venv/bin/python" scripts/lockfile.py write "$venv/bin/python" "$new"
"$venv/bin/python" scripts/lockfile.py diff requirements/lock.txt "$new"
if "$venv/bin/python" -m pytest -n 2 --dist loadfile "$@"; then
    cp "$new" requirements/lock.txt
    echo "lock: the suite passed with the newest releases; requirements/lock.txt now names them" \
         "(commit it)."
else
    echo "lock: the suite FAILED with the newest releases; requirements/lock.txt is unchanged." \
         "The releases above that differ from it are the suspects: fix what one broke, or cap it" \
         "in requirements/caps.txt with the reason, then run 'make lock' again." >&2
    exit 1
fi
