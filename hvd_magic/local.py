"""Driver-only launch (``--np -N``): N rank processes on this machine, no Spark at all.

The tasks are threads of the driver running the very same `hvd_magic.task.run_task` as Spark's
barrier tasks; a `LocalCoordinator` stands in for `BarrierTaskContext` (every task's address is
this machine). Everything else (capture, events, views, results, errors) is shared with Spark
runs.
"""

import threading

from .task import Coordinator, run_task


class LocalCoordinator(Coordinator):
    def __init__(self, index, gpus=()):
        self.partition_id = index
        self.attempt = 0
        self._gpus = list(gpus)

    def task_address(self, partition_id):
        return "127.0.0.1"

    def gpus(self):
        return self._gpus


def visible_gpus():
    """GPUs of this machine, as CUDA_VISIBLE_DEVICES would name them (empty without a GPU)."""
    import os
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except ImportError:
        return []


class LocalLauncher:
    """Runs N tasks as threads of the driver; each spawns its rank process."""

    where = "driver only"
    driver_host = "127.0.0.1"

    def __init__(self):
        self.outcomes = None
        self.error = None
        self._threads = []

    def prepare(self, np):
        return None

    def broadcast(self, data):
        return data  # already on the machine the ranks run on

    def start(self, settings, np):
        gpus = visible_gpus()
        outcomes = [None] * np

        def task(index):
            # Ranks get GPUs by local rank, as on a single multi-GPU machine.
            mine = [gpus[index % len(gpus)]] if gpus else []
            try:
                outcomes[index] = run_task(settings, LocalCoordinator(index, mine))
            except BaseException as exc:  # reported by the driver loop
                self.error = self.error or exc

        self._threads = [threading.Thread(target=task, args=(i,), name=f"hvd-magic-task-{i}",
                                          daemon=True) for i in range(np)]
        for t in self._threads:
            t.start()
        self._outcomes = outcomes

    def done(self):
        if self._threads and not any(t.is_alive() for t in self._threads):
            if self.outcomes is None and self.error is None:
                self.outcomes = self._outcomes
            return True
        return False

    def join(self, timeout=None):
        for t in self._threads:
            t.join(timeout)
        self.done()

    def cancel(self):
        pass  # the driver's stop message over the event channel ends every rank

    def job_ids(self):
        return []
