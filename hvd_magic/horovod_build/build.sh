#!/usr/bin/env bash
# Build Horovod 0.28.1 for the torch and TensorFlow in the given environment, cache the wheel,
# install it.
#
# The published 0.28.1 sdist compiles with -std=c++14 and so fails against torch >= 2.1, and its
# TensorFlow part neither compiles against TensorFlow 2.21 nor works with Keras 3.
# We download the sdist from the package registry, apply our patches (patches/horovod-0.28.1-*.patch
# beside this script: C++17; the XLA ops (GPU only) left out of CPU builds; no busy-spinning in the
# timeline writer and the torch wait loop; HOROVOD_GLOO_IFACE also for the process-set contexts,
# which otherwise bind to what the hostname resolves to and break ranks on hosts whose name
# resolves to a loopback address; Keras 2 (tf_keras) for Horovod's Keras wrappers where `keras` is
# Keras 3; in elastic mode, the background loop ended by a collective that failed, whose next
# negotiation would otherwise make Gloo abort a survivor still inside it; the rendezvous server
# retried for HOROVOD_GLOO_TIMEOUT_SECONDS while it cannot be reached, not 3 times in 1.5 s, so
# that a network cut for seconds during hvd.init() aborts no rank), build ONE wheel with
# PyTorch and TensorFlow, Gloo, without MPI/MXNet, and keep it in
# ~/.cache/hvd_magic/wheels/<key>/ where <key> names the Python, torch and TensorFlow versions and
# a hash of the patches: the second run installs in seconds. Without TensorFlow in the environment
# the wheel is for torch alone (its key says tfnone). A wheel is tied to the torch and TensorFlow
# it was built against.
#
# It ships inside the hvd_magic package (package data, with its patches), so that
# `python -m hvd_magic.build_horovod` (what a pip user runs; it checks the tools first and says
# what the build costs) works without this repository; `make setup` and binder/postBuild run it
# through scripts/build_horovod.sh. One recipe, not two.
#
# Usage: build.sh PREFIX [stock] [--wheel-only | --print-wheel-dir]
#   PREFIX: a venv or conda prefix (only PREFIX/bin/python is used)
#   stock: apply only what it takes to compile against this torch and TensorFlow (C++17, no XLA
#   ops), for the benchmark that compares against unpatched Horovod.
#   --wheel-only: build the wheel into the cache (if it is not there) and stop; nothing is
#   installed into PREFIX, so scripts/setup.sh can install other packages there meanwhile.
#   --print-wheel-dir: print the cache folder this environment's wheel is (or would be) in, and
#   stop: the key, computed here only, for hvd_magic.build_horovod's plan.
set -euo pipefail

venv=${1:?usage: build.sh PREFIX [stock] [--wheel-only | --print-wheel-dir]}
flavour=patched
wheel_only=0
print_only=0
for arg in "${@:2}"; do
    case $arg in
        stock) flavour=stock ;;
        --wheel-only) wheel_only=1 ;;
        --print-wheel-dir) print_only=1 ;;
        *) echo "build.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
py="$venv/bin/python"
version=0.28.1

patches=("$here/patches/horovod-$version-cxx17.patch"
         "$here/patches/horovod-$version-tf-build.patch")
if [[ $flavour != stock ]]; then
    patches+=("$here/patches/horovod-$version-no-spin.patch"
              "$here/patches/horovod-$version-process-set-iface.patch"
              "$here/patches/horovod-$version-tf-keras2.patch"
              "$here/patches/horovod-$version-elastic-stop.patch"
              "$here/patches/horovod-$version-rendezvous-retry.patch")
fi

pyver=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
torchver=$("$py" -c 'import torch; print(torch.__version__)')
# From the package metadata: importing TensorFlow just to ask takes seconds.
tfver=$("$py" -c '
from importlib.metadata import version, PackageNotFoundError
for name in ("tensorflow-cpu", "tensorflow"):
    try:
        print(version(name))
        break
    except PackageNotFoundError:
        pass
else:
    print("none")')
# The recipe's own version goes into the hash too: bump it when the wheel's content changes
# without a patch changing (2: the wheel records what it was built against).
recipe=2
patchhash=$( (echo "recipe $recipe"; cat "${patches[@]}") | sha256sum | cut -c1-12)
cache=${HVD_MAGIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_magic}
wheeldir="$cache/wheels/horovod-$version-$pyver-torch$torchver-tf$tfver-$patchhash"
if (( print_only )); then
    echo "$wheeldir"
    exit 0
fi

verify() {
    TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1 "$py" - "$tfver" "$flavour" <<'EOF'
import sys
import horovod.torch as hvd
assert hvd.gloo_built(), "Horovod was built without Gloo"
frameworks = ["horovod.torch"]
if sys.argv[1] != "none":
    import horovod.tensorflow as hvd_tf
    assert hvd_tf.gloo_built(), "Horovod's TensorFlow part was built without Gloo"
    frameworks.append("horovod.tensorflow")
    if sys.argv[2] != "stock":  # stock Horovod's Keras wrappers need Keras 2 as `keras`
        import horovod.keras, horovod.tensorflow.keras  # noqa: F401
        frameworks += ["horovod.keras", "horovod.tensorflow.keras"]
import horovod
print(f"horovod {horovod.__version__}: {', '.join(frameworks)} import, gloo_built=True")
EOF
}

installed_key="$venv/.horovod-key"
if (( ! wheel_only )) && [[ -f $installed_key && $(cat "$installed_key") == "$wheeldir" ]] &&
        verify >/dev/null 2>&1; then
    echo "horovod: already installed from $wheeldir"
    exit 0
fi

if ! ls "$wheeldir"/horovod-*.whl >/dev/null 2>&1; then
    echo "horovod: building $version ($flavour) for $pyver torch $torchver tensorflow $tfver (6-10 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$py" -m pip download --quiet --no-deps --no-binary :all: "horovod==$version" -d "$work"
    tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
    for p in "${patches[@]}"; do
        patch --quiet -p1 -d "$work/horovod-$version" < "$p"
    done
    # What the compiled parts fit, for hvd_magic.rank.buildcheck and %horovod_env: with another
    # torch or TensorFlow they fail with an undefined symbol that names neither.
    tfrecord=$([[ $tfver == none ]] && echo None || echo "\"$tfver\"")
    printf '# Written by hvd_magic/horovod_build/build.sh: the versions this build fits.\nBUILT_WITH = {"torch": "%s", "tensorflow": %s, "flavour": "%s"}\n' \
        "$torchver" "$tfrecord" "$flavour" > "$work/horovod-$version/horovod/_hvd_magic_build.py"
    cmake_major=$(cmake --version 2>/dev/null | sed -n 's/cmake version \([0-9]*\).*/\1/p')
    if [[ -z $cmake_major ]]; then  # (into the build's own folder: nothing goes into PREFIX)
        "$py" -m pip install --quiet --target "$work/cmake" "cmake>=3.13,<4"
        export PATH="$work/cmake/bin:$PATH" PYTHONPATH="$work/cmake${PYTHONPATH:+:$PYTHONPATH}"
    elif (( cmake_major >= 4 )); then
        export CMAKE_POLICY_VERSION_MINIMUM=3.5   # bundled Gloo asks for cmake 2.8.12
    fi
    if [[ $tfver == none ]]; then
        export HOROVOD_WITHOUT_TENSORFLOW=1
    else
        export HOROVOD_WITH_TENSORFLOW=1   # fail the build rather than leave TensorFlow out quietly
    fi
    mkdir -p "$work/dist"
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
        "$py" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" "$work/horovod-$version"
    mkdir -p "$wheeldir"
    mv "$work"/dist/horovod-*.whl "$wheeldir/"
fi
if (( wheel_only )); then
    echo "horovod: wheel in $wheeldir"
    exit 0
fi

"$py" -m pip install --quiet --force-reinstall --no-deps "$wheeldir"/horovod-*.whl
# Horovod's own runtime requirements (we installed the wheel without dependencies).
"$py" -m pip install --quiet cloudpickle psutil pyyaml packaging cffi
verify
echo "$wheeldir" > "$installed_key"
