"""The slots a sweep's trials share, and the gang rule: a trial starts only when all of its
ranks' slots are free, and holds them all until its run ends (never part of them).

Slots: on the driver (``--np -N``) the machine's GPUs when it has some (each trial's ranks on
GPUs of their own, given to its run as its CUDA_VISIBLE_DEVICES), else its cores; on Spark the
task slots the session has now (`hvd_magic.launch.spark.cluster_slots`), or ``local[N]``'s N
before a session is started. ``slots=`` (the API) says it outright.

Not for: Spark's own scheduling (a barrier stage that finds too few slots waits inside Spark:
the sweep never asks for more slots than it counted free).
"""

import os
import re

from ..words import plural


def count_slots(placement):
    """(slots, what they are, the GPUs' ids or None) for `placement`'s trials."""
    if placement.on_driver:
        from ..launch.local import visible_gpus
        gpus = visible_gpus()
        if gpus:
            return len(gpus), "GPUs", list(gpus)
        return os.cpu_count() or 1, "cores", None
    from ..launch.sparkstart import _active_context
    sc = _active_context() if placement.spark is None else placement.spark.sparkContext
    if sc is not None:
        from ..launch.spark import cluster_slots
        return max(1, cluster_slots(sc)), "Spark task slots", None
    match = re.fullmatch(r"local\[(\d+|\*)\]", placement.master or "")
    if match and match.group(1) != "*":
        return int(match.group(1)), "Spark task slots", None
    return max(os.cpu_count() or 1, placement.ranks), "Spark task slots", None


class Slots:
    """Free and held slots (a GPU's id where the slots are GPUs)."""

    def __init__(self, total, what="slots", gpus=None):
        self.total, self.what = total, what
        self.free_gpus = list(gpus) if gpus else None
        self.held = {}  # trial number -> slots (GPU ids) it holds

    @property
    def free(self):
        return self.total - sum(len(v) if isinstance(v, list) else v for v in self.held.values())

    def take(self, number, n):
        """Hold `n` slots for a trial, all or none: the GPU ids (a list), True, or None."""
        if n > self.free:
            return None
        if self.free_gpus is not None:
            mine, self.free_gpus = self.free_gpus[:n], self.free_gpus[n:]
            self.held[number] = mine
            return mine
        self.held[number] = n
        return True

    def give_back(self, number):
        held = self.held.pop(number, None)
        if isinstance(held, list) and self.free_gpus is not None:
            self.free_gpus.extend(held)

    def waiting_text(self, n):
        """What a waiting trial waits for: "2 slots, 0 free"."""
        return f"{plural(n, self.what[:-1] if self.what.endswith('s') else self.what)}, " \
               f"{self.free} free"
