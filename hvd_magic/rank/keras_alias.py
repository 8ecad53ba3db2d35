"""Make a rank's ``import keras`` give Keras 2 (the ``tf_keras`` package) when asked for.

Why: from TensorFlow 2.16 on, the ``keras`` package is Keras 3, and Horovod's Keras wrappers
(``horovod.keras``, ``horovod.tensorflow.keras``: DistributedOptimizer, the callbacks) only work
with Keras 2 models and optimizers; with a Keras 3 model, ``fit`` fails deep inside Keras. Code
written for HorovodRunner says ``import keras`` and means Keras 2. TensorFlow's own switch for this
is ``TF_USE_LEGACY_KERAS=1`` (``tf.keras`` becomes ``tf_keras``); the ranks get it by default
(`hvd_magic.driver.run.DEFAULT_RANK_ENV`) and we extend the same choice to ``import keras``, so
``keras`` and ``tf.keras`` are one Keras on a rank. ``--env TF_USE_LEGACY_KERAS=0`` turns both
back to Keras 3.

How: a finder first in ``sys.meta_path`` answers for ``keras`` and ``keras.*``; loading one imports
the ``tf_keras`` module of the same name and puts that very object in ``sys.modules`` under the
``keras`` name (the import system returns what ``sys.modules`` holds after ``exec_module``). So
``keras.layers.Dense is tf_keras.layers.Dense`` and no module is loaded twice. Nothing is imported
before the user's code asks: a rank that never touches Keras pays nothing.

Not for: the driver. The notebook's own ``keras`` is left alone.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

ALIAS, TARGET = "keras", "tf_keras"


def wanted(environ=None):
    """True when this rank should get Keras 2 as ``keras``: TF_USE_LEGACY_KERAS is on."""
    value = (environ if environ is not None else os.environ).get("TF_USE_LEGACY_KERAS", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name != ALIAS and not name.startswith(ALIAS + "."):
            return None
        real = TARGET + name[len(ALIAS):]
        # is_package matters: `import keras.layers` needs the parent to look like a package.
        return importlib.machinery.ModuleSpec(name, self, is_package=True,
                                              loader_state=real)

    def create_module(self, spec):
        return None  # a placeholder module; exec_module swaps in the real one

    def exec_module(self, module):
        real = importlib.import_module(module.__spec__.loader_state)
        sys.modules[module.__spec__.name] = real


def install(environ=None):
    """Alias ``keras`` to ``tf_keras`` in this process if wanted and possible; True if done."""
    if not wanted(environ) or ALIAS in sys.modules:
        return False
    if importlib.util.find_spec(TARGET) is None:  # no tf_keras: leave `keras` as installed
        return False
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
    return True
