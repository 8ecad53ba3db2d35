"""JAX on a rank: its devices chosen before the cell imports it, and a bare
``jax.distributed.initialize()`` that finds the launched world (`hvd_magic.frameworks.jax`).

- Devices, by variables JAX reads at import (a ``--env`` or the cell's own setting wins): a rank
  without a GPU of its own gets ``JAX_PLATFORMS=cpu`` (else JAX probes for CUDA and TPU plugins
  and warns); a rank with one gets ``JAX_LOCAL_DEVICE_IDS``, its own GPU among those it sees
  (the list `hvd_magic.task.gpus` gives it, as torch's ``cuda:LOCAL_RANK``), and
  ``XLA_PYTHON_CLIENT_PREALLOCATE=false``: JAX's default takes 75% of the GPU at its first array,
  which leaves nothing for torch or for a peer on a shared GPU.
- Once the cell imports JAX, the launch is registered as a cluster JAX detects
  (`hvd_magic.compat.jax`), and ``jax.distributed.initialize`` called again in a rank where it
  already ran (a warm session's next cell) returns at once: JAX raises on a second call.

No rank is forked from an interpreter that used JAX's backend (a process forked after that
hangs): JAX is not among the modules a template holds (`hvd_magic.template.FORKABLE`), so a
JAX cell's ranks import it themselves.
"""

import functools
import os

from . import hooks, jax_waits
from .gpus import OWN


def _devices():
    own = os.environ.get(OWN)
    if own:
        os.environ.setdefault("JAX_LOCAL_DEVICE_IDS", own)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    else:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _once(initialize):
    @functools.wraps(initialize)
    def initialize_once(*args, **kwargs):
        import jax.distributed
        if jax.distributed.is_initialized():  # a warm session's earlier cell made it
            return None
        return initialize(*args, **kwargs)
    return initialize_once


def _on_import(jax):
    from ..compat.jax import register_cluster
    register_cluster()
    import jax.distributed
    if not hasattr(jax.distributed, "is_initialized"):
        return  # (an older JAX: a second initialize raises as JAX's own does)
    jax.distributed.initialize = _once(jax.distributed.initialize)


def install():
    """JAX's device variables now; the cluster, initialize and JAX's waits (`jax_waits`) hooked
    for when the cell imports it."""
    _devices()
    hooks.when_imported("jax", _on_import)
    jax_waits.install()
