#!/usr/bin/env bash
# Install TensorFlow (CPU) and Keras 2 into the given Python environment, for horovod.tensorflow and
# horovod.keras on the ranks. Run by scripts/setup.sh and binder/postBuild (one recipe), before
# scripts/build_horovod.sh, which builds Horovod against the TensorFlow found here.
#
# tensorflow-cpu, not tensorflow: the GPU package is ~300 MB larger and prints a cuInit failure on
# every rank of a machine without a GPU. tf-keras is Keras 2 (from TensorFlow 2.16 on the `keras`
# package is Keras 3, which Horovod's Keras wrappers cannot wrap); it goes in with --no-deps because
# it requires `tensorflow`, which would install the GPU package over tensorflow-cpu's own files.
#
# Usage: scripts/install_tensorflow.sh PREFIX   (a venv or conda prefix: only PREFIX/bin/python is used)
set -euo pipefail
prefix=${1:?usage: install_tensorflow.sh PREFIX}
version=2.21.0
py="$prefix/bin/python"
"$py" -m pip install --quiet "tensorflow-cpu==$version"
"$py" -m pip install --quiet --no-deps "tf-keras==$version"
