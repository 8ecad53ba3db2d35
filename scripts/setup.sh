#!/usr/bin/env bash
# Set up everything hvd_magic needs, idempotently: Java 17+, .venv with the project and its
# dependencies, TensorFlow, and Horovod built from source (cached in ~/.cache/hvd_magic).
#
# Every package comes at the version requirements/lock.txt names (the releases the suite last
# passed with), so a fresh machine gets what CI passed with: a new release of anything we or our
# dependencies ask for unpinned cannot turn a fresh clone red. scripts/refresh_lock.sh (make lock)
# tries the newest releases on purpose and rewrites the lock when the suite passes with them.
#   HVD_MAGIC_VENV=DIR    set up DIR instead of .venv
#   HVD_MAGIC_LOCK=none   the newest releases (less requirements/caps.txt's caps), not the lock's
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
venv=${HVD_MAGIC_VENV:-$here/.venv}
torch_version=2.13.0
if [[ ${HVD_MAGIC_LOCK:-} == none ]]; then
    lock="$here/requirements/caps.txt"
else
    lock="$here/requirements/lock.txt"
fi
# Every pip below (TensorFlow's and Horovod's scripts' too) reads it from the environment.
export PIP_CONSTRAINT="$lock"

# Java 17+ for pyspark 4.
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null || (( $(java_major) < 17 )); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "setup: installing Java 17 (openjdk-17-jre-headless)"
        # One apt at a time on this machine (another clone's set-up or suite may be installing:
        # tests/conftest.py's apt_install takes the same lock), and wait for anyone else's.
        (flock 9 2>/dev/null || true
         apt-get -o DPkg::Lock::Timeout=600 update -qq &&
             DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
                 openjdk-17-jre-headless >/dev/null) 9>>/tmp/hvd_magic-apt.lock
    else
        echo "setup: Spark needs Java 17 or newer. Run:  sudo apt-get install -y openjdk-17-jre-headless" >&2
        exit 1
    fi
fi

if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
stamp="$venv/.deps-key"
key=$(cat pyproject.toml scripts/install_tensorflow.sh "$lock" | sha256sum | cut -c1-16)
if [[ ! -f $stamp || $(cat "$stamp") != "$key" ]]; then
    # The packages take ~4.2 GB in .venv and pip unpacks wheels beside them: say so before a
    # long install ends in pip's "No space left on device".
    free_gb=$(( $(df -Pk "$venv" | awk 'NR == 2 {print $4}') / 1024 / 1024 ))
    if (( free_gb < 6 )); then
        echo "setup: .venv needs about 6 GB free on $(df -P "$venv" | awk 'NR == 2 {print $6}')," \
             "and it has ${free_gb} GB. Free some space (old clones' .venv folders, /tmp)," \
             "then run it again." >&2
        exit 1
    fi
    echo "setup: installing Python packages into $venv"
    "$py" -m pip install --quiet --upgrade pip
    # torch, pinned (the CPU build this machine has), and TensorFlow first: Horovod is built
    # against both, and nothing else.
    "$py" -m pip install --quiet "torch==$torch_version"
    bash scripts/install_tensorflow.sh "$venv"
    # Horovod's compile (minutes of CPU on a cold machine) runs while the project and its extras
    # install. Those may add packages but change none already there (the constraints): the
    # build imports torch and TensorFlow, which must stay as they are meanwhile.
    log=$(mktemp)
    echo "setup: building Horovod meanwhile (its output: $log)"
    bash "$here/scripts/build_horovod.sh" "$venv" --wheel-only >"$log" 2>&1 &
    build=$!
    "$py" -m pip list --format=freeze >"$log.pins"
    if ! "$py" -m pip install --quiet -c "$log.pins" -e ".[spark,test,connect,bench,mlflow]"; then
        kill "$build" 2>/dev/null || true
        exit 1
    fi
    if ! wait "$build"; then
        cat "$log" >&2
        exit 1
    fi
    cat "$log"
    rm -f "$log" "$log.pins"
    echo "$key" > "$stamp"
fi
bash "$here/scripts/build_horovod.sh" "$venv"
# DeepSpeed's C++ op that its CPU ranks need (deepspeed_shm_comm, 3-5 minutes to compile cold),
# built once per host into ~/.cache/hvd_magic/torch_extensions, where the suite's first DeepSpeed
# test and every later run find it: ~6 s (an import) when it is there already.
"$py" -m hvd_magic.prebuild deepspeed ||
    echo "setup: DeepSpeed's op not prebuilt: the first DeepSpeed run compiles it" >&2
