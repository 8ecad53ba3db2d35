"""TensorFlow's (and Keras') internal modules that a rank reads or patches: the profiler's XSpace
message, which TensorFlow ships without a public name and has moved between releases; the
modules of the multi-worker strategy, of tf.function and of Keras' callback list.

Called only where TensorFlow is already imported (a TensorFlow rank's ``--timeline``).
"""

import importlib
import importlib.util

from . import unavailable

# Where TensorFlow has kept its copy of the XSpace message, newest first.
XPLANE_MODULES = ("tensorflow.tsl.profiler.protobuf.xplane_pb2",  # 2.12 and later
                  "tsl.profiler.protobuf.xplane_pb2",
                  "tensorflow.core.profiler.protobuf.xplane_pb2")  # before 2.12


def xspace():
    """A fresh, empty XSpace message (``xplane_pb2.XSpace()``), or None where this TensorFlow
    keeps it nowhere we know (said once: the rank's timeline then has no TensorFlow events; the
    profile itself is kept for TensorBoard)."""
    for name in XPLANE_MODULES:
        try:
            return importlib.import_module(name).XSpace()
        except (ImportError, AttributeError):
            continue
    unavailable("tensorflow", "the profiler's XSpace message (xplane_pb2)",
                "a TensorFlow rank's --timeline shows no events (TensorBoard still opens its "
                "profile)")
    return None


# TensorFlow's and Keras' internal modules that a rank patches right after each loads (the
# public names, ``tf.distribute.MultiWorkerMirroredStrategy`` and ``keras.callbacks.CallbackList``,
# are aliases of classes defined there).
COLLECTIVE_STRATEGY = "tensorflow.python.distribute.collective_all_reduce_strategy"
KERAS_CALLBACK_LISTS = {"keras": "keras.src.callbacks.callback_list",
                        "tf_keras": "tf_keras.src.callbacks"}
FUNCTION_MODULES = ("tensorflow.python.eager.polymorphic_function.polymorphic_function",
                    "tensorflow.python.eager.def_function")  # (before 2.12)


def check_modules(package):
    """Called once `package` (``tensorflow``, ``keras`` or ``tf_keras``) is imported: say once
    where an internal module a rank patches is no module of this version (the patch then never
    happens)."""
    name = package.__name__
    if name == "tensorflow" and not _found(COLLECTIVE_STRATEGY):
        unavailable("tensorflow", "the multi-worker strategy's module",
                    "stall views do not see a TensorFlow rank waiting in its collectives",
                    version=getattr(package, "__version__", None))
    internal = KERAS_CALLBACK_LISTS.get(name)
    if internal is not None and not _found(internal):
        unavailable(name, "Keras' callback list module",
                    "a --timeline of a Keras fit counts no steps",
                    version=getattr(package, "__version__", None))


def _found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # (a parent package missing)
        return False


def function_class():
    """The class of a ``tf.function`` (its ``__call__`` is where a rank waits in a multi-worker
    strategy's collectives), or None where this TensorFlow keeps it nowhere we know."""
    for name in FUNCTION_MODULES:
        try:
            return importlib.import_module(name).Function
        except (ImportError, AttributeError):
            continue
    unavailable("tensorflow", "tf.function's class",
                "stall views do not see a TensorFlow rank waiting inside a tf.function")
    return None
