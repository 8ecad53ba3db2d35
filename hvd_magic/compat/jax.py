"""JAX's private pieces hvd_magic uses: its cluster auto-detection (`jax._src.clusters`), and
the class of its arrays (`jax._src.array.ArrayImpl`), whose waits `hvd_magic.rank.jax_waits`
wraps.

A bare ``jax.distributed.initialize()`` reads the coordinator from ``JAX_COORDINATOR_ADDRESS``
(public) but the process count and id only from a detected cluster (Slurm, Open MPI, TPU VMs,
Kubernetes): each is a ``ClusterEnv`` subclass that registers itself when defined. Ours reads the
launch's variables (`hvd_magic.frameworks.jax`) and is put first, so a rank on a Slurm or
Kubernetes host is still seen as ours. Where this JAX has no such class, the cell must pass
``num_processes`` and ``process_id`` itself, and is told so once.
"""

import os

from . import unavailable

PROCESS_COUNT = "HVD_MAGIC_JAX_PROCESS_COUNT"
PROCESS_ID = "HVD_MAGIC_JAX_PROCESS_ID"
COORDINATOR = "JAX_COORDINATOR_ADDRESS"


def register_cluster():
    """Make the launch a cluster JAX detects. Returns whether it is (False where this JAX lacks
    `ClusterEnv`: then one line says what to pass instead)."""
    try:
        from jax._src import clusters
    except ImportError:
        clusters = None
    base = getattr(clusters, "ClusterEnv", None)
    known = getattr(base, "_cluster_types", None)
    if base is None or not isinstance(known, list):
        unavailable("jax", "cluster auto-detection (jax._src.clusters.ClusterEnv)",
                    "pass jax.distributed.initialize(num_processes=int(os.environ['WORLD_SIZE']),"
                    " process_id=int(os.environ['RANK']))")
        return False
    if any(getattr(c, "name", "") == "hvd_magic" for c in known):
        return True

    class HvdMagicCluster(base):
        """The ranks of a hvd_magic launch (defining it appends it to `known`)."""

        name = "hvd_magic"

        @classmethod
        def is_env_present(cls):
            return PROCESS_COUNT in os.environ and COORDINATOR in os.environ

        @classmethod
        def get_coordinator_address(cls, timeout_secs=None, override_coordinator_port=None):
            host, _, port = os.environ[COORDINATOR].rpartition(":")
            return f"{host}:{override_coordinator_port or port}"

        @classmethod
        def get_process_count(cls):
            return int(os.environ[PROCESS_COUNT])

        @classmethod
        def get_process_id(cls):
            return int(os.environ[PROCESS_ID])

        @classmethod
        def get_local_process_id(cls):
            return None  # the rank's own GPU comes by JAX_LOCAL_DEVICE_IDS (public)

    known.remove(HvdMagicCluster)
    known.insert(0, HvdMagicCluster)  # before Slurm's or Kubernetes' on a host that has them
    return True


def wrap_array_waits(wrap):
    """Replace the waits of JAX's arrays (`jax._src.array.ArrayImpl`) by `wrap(fn, what)`:
    ``block_until_ready`` (what: "block_until_ready") and ``_value`` (what: "value", read by
    ``np.asarray``, ``float``, ``print``), both of which wait for the computation that makes an
    array, a collective's included. Once; False where this JAX keeps them elsewhere (said once)."""
    try:
        from jax._src.array import ArrayImpl
    except ImportError:
        ArrayImpl = None
    value = getattr(ArrayImpl, "_value", None) if ArrayImpl is not None else None
    if not callable(getattr(ArrayImpl, "block_until_ready", None)) or \
            not isinstance(value, property):
        unavailable("jax", "jax.Array's waits (jax._src.array.ArrayImpl)",
                    "a rank waiting in block_until_ready is not named as in a collective")
        return False
    if getattr(ArrayImpl.block_until_ready, "_hvd_magic_wait", False):
        return True
    method = ArrayImpl.block_until_ready  # (a C++ method: functools.wraps cannot read it)

    def block_until_ready(self):
        return method(self)

    ArrayImpl.block_until_ready = wrap(block_until_ready, "block_until_ready")
    ArrayImpl.block_until_ready._hvd_magic_wait = True
    ArrayImpl._value = property(wrap(value.fget, "value"))
    return True
