"""TensorFlow's internal modules that a rank reads: the profiler's XSpace message, which
TensorFlow ships without a public name, and has moved between releases.

Called only where TensorFlow is already imported (a TensorFlow rank's ``--timeline``).
"""

import importlib

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
