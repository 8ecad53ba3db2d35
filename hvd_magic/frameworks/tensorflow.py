"""tf.distribute's part of a rank's start: a ``TF_CONFIG`` per rank, so that
``tf.distribute.MultiWorkerMirroredStrategy()`` in a cell finds every rank as one worker of one
cluster (``{"cluster": {"worker": [host:port, ...]}, "task": {"type": "worker", "index": rank}}``,
the workers in rank order).

Every rank serves TensorFlow's gRPC on a port of its own host, which every other rank must know
before any starts. No port race: each task binds its rank's port first (`reserve`) and keeps it
bound, not listening, until the rank ends, with ``SO_REUSEADDR``; a plain bind cannot take it, the
kernel never hands a bound port out as an ephemeral one, and TensorFlow's gRPC server (which binds
with ``SO_REUSEADDR`` too) can (measured: TF 2.21's server listens on it). The driver gathers every
task's address and relays them all (`frameworks.Gathering`).

Nothing here imports TensorFlow: a cell that never imports it pays one bound socket per rank, and
the strategy is still the first TensorFlow op of the rank (it must be: "Collective ops must be
configured at program startup").
"""

import json
import socket

from ..task.plan import _resolve
from .base import Framework, Served


class TensorFlowDistributed(Framework):
    name = "tensorflow"

    def reserve(self, slot):
        reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reserved.bind(("", 0))
        address = f"{_resolve(slot.hostname)}:{reserved.getsockname()[1]}"
        return Served({"address": address}, reserved.close)

    def rank_env(self, slot, world, relayed):
        workers = [task["address"] for task in relayed.get("tasks") or () if task]
        if len(workers) != world.size:  # (an environment made elsewhere: Horovod's elastic runs)
            return {}
        return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                         "task": {"type": "worker", "index": slot.rank}})}
