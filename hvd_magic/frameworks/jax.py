"""JAX's part of a rank's start: what a bare ``jax.distributed.initialize()`` reads, so that a
cell written for a JAX cluster runs unchanged on the launched ranks.

JAX reads none of torchrun's variables. It reads the coordinator from
``JAX_COORDINATOR_ADDRESS``, and the process count and id only from a cluster it detects (Slurm,
Open MPI, TPU VMs, Kubernetes): each rank registers the launch as one such cluster once the cell
imports JAX (`hvd_magic.rank.jax_setup`, through `hvd_magic.compat.jax`), reading
``HVD_MAGIC_JAX_PROCESS_COUNT`` and ``HVD_MAGIC_JAX_PROCESS_ID`` from here. Arguments the cell
passes still win: JAX asks the cluster only for what it was not given.

The coordinator (rank 0's gRPC service) needs a port of its own: on torch's ``MASTER_PORT`` it
makes torch's rendezvous fail with EADDRINUSE. Task 0 keeps one more port bound (not listening,
``SO_REUSEADDR``) for the whole launch, as for torch's store; the coordinator, which binds with
``SO_REUSEADDR`` too, can take it and no one else can. Collectives on CPU go over Gloo
(``JAX_CPU_COLLECTIVES_IMPLEMENTATION``, JAX's default since 0.5.1, set so an older or changed
default does not leave the ranks unconnected). Nothing here imports JAX.
"""

from ..compat.jax import COORDINATOR, PROCESS_COUNT, PROCESS_ID
from ..rank import sockets
from .base import Framework, Served


class JaxDistributed(Framework):
    name = "jax"

    def serve(self):
        held = sockets.reserve()
        return Served({"port": held.getsockname()[1]}, held.close)

    def rank_env(self, slot, world, relayed):
        if "port" not in relayed:  # (an environment made elsewhere: Horovod's elastic runs)
            return {}
        return {
            COORDINATOR: f"{world.address}:{relayed['port']}",
            PROCESS_COUNT: world.size,
            PROCESS_ID: slot.rank,
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        }
