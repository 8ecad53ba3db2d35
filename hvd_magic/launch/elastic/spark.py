"""Elastic runs on Spark (``--np N --min-np M [--max-np K]``): Horovod's elastic driver in the
notebook, its workers in plain Spark tasks that hold a slot each.

A barrier stage aborts as a whole when one task is lost, so an elastic run cannot be one. Each of
the `max_np` slots is instead a Spark job of one plain task (`hvd_magic.task.elastic_slot`):

- a slot is offered to Horovod's discovery while its task is there (it said ``slot``);
  Horovod starts a worker in it by our ``worker`` order, which carries the environment Horovod
  made for that host key; the task runs our rank process with it;
- a rank process that dies: the task offers its slot again (a new key, once the survivors train
  again: `ElasticLauncher`); an executor that is lost: its connection ends, the worker counts as
  dead at once, and Spark runs the task again where it has capacity (a restarted worker, a new
  executor), whose rank joins at the next commit. Each slot may be re-run
  ``spark.task.maxFailures - 1`` times by Spark (a job per slot: one slot's failures never end
  another's);
- slots beyond the ranks Spark can hold now wait in Spark's queue and join when capacity comes,
  up to `max_np`; when the run ends, the slots still waiting are cancelled;
- results come back as Spark task results, as in a barrier run.

Not for: the ring, keys and replacements (`ElasticLauncher`), or what a slot's task does.
"""

import functools
import queue
import threading
import time

from ...errors import LaunchError
from ...compat import pyspark as pyspark_compat
from ...event_server import EventServer
from ...task.elastic_slot import elastic_slot_task
from .launcher import ElasticLauncher
from ..spark import SparkLauncher, workers_python
from ..spark_errors import java_message

RESULTS_WAIT = 60.0  # seconds, once the run ended, for the slots' tasks to return their results


class _Slot:
    """The Spark task holding a slot now: its host, the worker it runs (a key), how it ended."""

    def __init__(self, host, machine=None):
        self.host = host
        self.machine = machine or host  # what tells its machine from others (`hosts`)
        self.key = None
        self.ended = None            # (slot, status, summary) of its worker
        self.done = threading.Event()


class _SlotEvents(queue.Queue):
    """The run's event queue (or, for a warm session, its `sink`), the slots' own events taken
    out for the launcher on the way."""

    def __init__(self, launcher, sink=None):
        super().__init__()
        self.launcher = launcher
        self.sink = sink

    def put(self, event, block=True, timeout=None):
        kind = event.get("t")
        if kind == "slot":
            return self.launcher._slot_ready(event)
        if kind == "dropped":
            return self.launcher._slot_gone(event.get("rank"))
        if kind == "exit" and "cell" not in event:  # a rank process's end, not a session cell's
            self.launcher._worker_ended(event)
        return self.forward(event)

    def forward(self, event):
        """`event` to the driver (a run's loop, or a session), as it is."""
        if self.sink is not None:
            return self.sink.put(event)
        return super().put(event)


class ElasticSparkLauncher(ElasticLauncher, SparkLauncher):
    """`np` ranks to begin with, between `min_np` and `max_np`, in Spark tasks of one slot each."""

    plain_tasks = True

    def __init__(self, np, min_np, max_np, elastic_timeout=None, **spark):
        super().__init__(min_np, max_np, elastic_timeout, **spark)
        self.np = np
        self._slots = {}         # slot -> _Slot: the task holding it now
        self._finished = set()   # slots whose worker finished or raised (still offered)
        self._results = {}       # slot -> its task's outcome, as Spark returned it
        self._jobs = {}          # slot -> the thread waiting on its Spark job
        self._failed_jobs = {}   # slot -> why its Spark job failed
        self._ended = False      # the run ended: a job cancelled now is no failure
        self._events = None

    @property
    def rendezvous_host(self):
        return self.driver_host

    def prepare(self, np):
        """The session, with room for the first `self.np` ranks (`np`: the view's rows)."""
        return SparkLauncher.prepare(self, self.np)

    def _initial_np(self, np):
        return self.np

    def open_channel(self, sink=None):
        self._events = _SlotEvents(self, sink)
        self._server = EventServer(host=self.bind_host, sink=self._events, report_drops=True)
        return self._server

    # -- the slots' tasks ---------------------------------------------------------------------
    def start(self, settings, np):
        from pyspark import InheritableThread

        sc = self.session.sparkContext
        self._claim(settings)
        with workers_python(sc):
            rdds = {}
            for slot in range(np):
                rdds[slot] = sc.parallelize([slot], 1).mapPartitions(
                    functools.partial(elastic_slot_task, settings))
                pyspark_compat.wrap_python_function(rdds[slot])  # now, with our interpreter
        super().start(settings, np)
        for slot, rdd in rdds.items():
            # PySpark's thread class, so that the job group reaches the JVM in pinned-thread mode
            thread = InheritableThread(target=self._slot_job, args=(settings, slot, rdd),
                                       name=f"hvd-magic-slot-{slot}", daemon=True)
            self._jobs[slot] = thread
            self._threads.append(thread)
            thread.start()

    def _slot_job(self, settings, slot, rdd):
        sc = self.session.sparkContext
        try:
            sc.setJobGroup(self.group, f"hvd_magic run {settings.run_id} (elastic slot {slot})",
                           interruptOnCancel=True)
            [outcome] = rdd.collect()
            with self._lock:
                self._results[slot] = outcome
        except BaseException as exc:
            if not (self._ended or self._stopping or self._cancelled):
                self._job_failed(slot, java_message(exc, sc.pythonExec))
        finally:
            if not pyspark_compat.is_stopped(sc):  # (the session may be stopped under the run)
                sc.setLocalProperty("spark.jobGroup.id", None)

    def _job_failed(self, slot, message):
        """Spark gave up on a slot (its task failed `spark.task.maxFailures` times, or could not
        start at all). Too few slots left to ever reach `min_np`: the run ends now, with why."""
        with self._lock:
            self._failed_jobs[slot] = message
            hopeless = len(self._failed_jobs) > self.max_np - self.min_np
        if hopeless and self.error is None:
            self.error = LaunchError(f"Spark could not keep enough slots for --min-np "
                                     f"{self.min_np}: slot {slot}: {message}")
            self._stop_elastic()
            if self._driver is not None:
                self._driver.stop()  # it may be waiting for slots that will never come

    def _has_capacity(self, slot):
        return slot in self._slots or slot in self._finished

    def _machine_of(self, key):
        from .launcher import slot_of

        task = self._slots.get(slot_of(key)[0])
        return task.machine if task is not None else key

    def _slot_ready(self, event):
        slot = event.get("rank")
        if not isinstance(slot, int):
            return
        with self._lock:
            earlier = self._slots.get(slot)
            self._slots[slot] = _Slot(event.get("host"), event.get("machine"))
        if earlier is not None:  # (Spark re-ran the slot's task before its end was heard)
            self._lose(earlier, slot)

    def _lose(self, task, slot):
        """The task holding `slot` is gone: a worker it ran is dead, and the driver loop hears
        it as the rank's exit."""
        with self._lock:
            if task.key is None or task.done.is_set():
                return
            message = (f"its Spark task on {task.host} ended (the executor was lost, or Spark "
                       f"killed the task)")
            task.ended = (slot, "died", {"rank": slot, "code": None, "message": message})
        task.done.set()
        self._events.forward({"t": "exit", "rank": slot, "code": None, "status": "died",
                              "summary": {"message": message, "host": task.host}})

    def _worker_ended(self, event):
        slot = event.get("rank")
        with self._lock:
            task = self._slots.get(slot)
            if task is None or task.key is None or task.done.is_set():
                return
            status = event.get("status")
            task.ended = (slot, status, dict(event.get("summary") or {}, rank=slot,
                                             code=event.get("code")))
            if status in ("ok", "error"):
                self._finished.add(slot)
        task.done.set()

    def _slot_gone(self, slot):
        """A slot's connection ended: its task returned, or its executor was lost."""
        with self._lock:
            task = self._slots.pop(slot, None)
        if task is not None:
            self._lose(task, slot)

    def _run_slot(self, slot, attempt, slot_info, env, events):
        with self._lock:
            task = self._slots.get(slot)
            if task is not None and task.key is None:
                task.key = slot_info.hostname
            else:
                task = None
        if task is None:
            return (slot, "died", {"rank": slot, "code": None,
                                   "message": "its Spark task was gone before the worker started"})
        with self._lock:  # the slots on its host share that host's cores (task/threads.py)
            beside = sum(1 for other in self._slots.values() if other.host == task.host)
        self._server.broadcast({"t": "worker", "slot": slot, "key": slot_info.hostname, "env": env,
                                "ranks_on_host": beside})
        told = False
        while not task.done.wait(0.1):
            if not told and any(e.is_set() for e in events):
                self._server.broadcast({"t": "stop_worker", "slot": slot})
                told = True
        return task.ended

    # -- the end ------------------------------------------------------------------------------
    def _final_outcomes(self):
        """The slots' results, once their tasks returned them; slots still waiting for Spark
        capacity are cancelled."""
        self._ended = True
        self._server.announce({"t": "slots_done"})
        deadline = time.monotonic() + RESULTS_WAIT
        with self._lock:
            holding = set(self._slots) | self._finished
        for slot in sorted(holding):
            self._jobs[slot].join(max(0.0, deadline - time.monotonic()))
        SparkLauncher.cancel(self)  # the slots that never got an executor
        with self._lock:
            return [self._results[s] for s in sorted(self._results)
                    if self._results[s][1] in ("ok", "error")]

    def cancel(self):
        super().cancel()             # no more replacements
        SparkLauncher.cancel(self)   # and every slot's task ends
