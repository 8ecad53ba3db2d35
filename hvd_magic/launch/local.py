"""Driver-only launch (``--np -N``): N rank processes on this machine, no Spark at all.

The tasks are threads of the driver running the very same `hvd_magic.task.run_task` as Spark's
barrier tasks; a `LocalCoordinator` stands in for `BarrierTaskContext` (every task's address is
this machine). Everything else (capture, events, views, results, errors) is shared with Spark
runs.
"""

import os

from .. import payload
from ..task import run_task
from ..task.settings import Coordinator
from .base import Launcher


class LocalCoordinator(Coordinator):
    def __init__(self, index, gpus=()):
        self.partition_id = index
        self.attempt = 0
        self._gpus = list(gpus)

    def task_address(self, partition_id):
        return "127.0.0.1"

    def gpus(self):
        return self._gpus


def visible_gpus(env=None):
    """GPUs of this machine, as CUDA_VISIBLE_DEVICES would name them (empty without a GPU):
    counted by the driver's NVML, as the resource sampler reads them, not by importing torch in
    the notebook (4.3 s of a kernel's first --np -N cell, and ~300 MB it then keeps). A run's
    own CUDA_VISIBLE_DEVICES (`env`: its --env, a sweep trial's GPUs) comes first."""
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    from ..task.nvml import Nvml
    return [str(i) for i in range(Nvml().count())]


class LocalLauncher(Launcher):
    """Runs N tasks as threads of the driver; each spawns its rank process."""

    where = "driver only"

    def share(self, data):
        return payload.LocalFile(data)  # written once; each rank reads it (not a copy per rank)

    def prepare(self, np):
        self._note_cores(np, "on the driver")

    def start(self, settings, np):
        gpus = visible_gpus(settings.extra_env)
        self._outcomes = [None] * np
        for index in range(np):
            # Ranks get GPUs by local rank, as on a single multi-GPU machine.
            mine = [gpus[index % len(gpus)]] if gpus else []
            self._in_background(self._task, f"hvd-magic-task-{index}", settings, index, mine)

    def _task(self, settings, index, gpus):
        try:
            self._outcomes[index] = run_task(settings, LocalCoordinator(index, gpus))
        except BaseException as exc:  # reported by the driver loop
            self.error = self.error or exc

    def done(self):
        if not super().done():
            return False
        if self.outcomes is None and self.error is None:
            self.outcomes = self._outcomes
        return True

    def join(self, timeout=None):
        super().join(timeout)
        self.done()
