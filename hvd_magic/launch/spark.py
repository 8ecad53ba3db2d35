"""Launch the ranks as one Spark barrier stage: all N tasks gang-scheduled, or none.

With an active SparkSession (a real cluster) it is used as it is. Otherwise an embedded
``local[N]`` session is adopted or started (UI off, quiet logs, workers on this very Python) and
marked as ours, so that a later run needing more slots may restart it (`spark_session`).

Before anything is submitted the slots are checked (a barrier stage that cannot fit would fail
with a Java ``BarrierJobSlotsNumberCheckFailed`` after minutes of retries), and dynamic allocation is
refused. Spark errors reach the user as one line, never as a Java stack trace.

Not for: widgets or anything the notebook shows; what a task does is `hvd_magic.task`.
"""

import contextlib
import functools
import sys
import threading
import time
import uuid

from IPython.core.error import UsageError

from .. import payload
from ..compat import pyspark as pyspark_compat
from ..errors import LaunchError, RunCancelled
from ..task import spark_task
from ..task.threads import executor_cores
from ..words import plural
from .shipping import send as ship_to
from .base import Launcher
from ..data.frames import check_data, data_plan
from .spark_errors import java_message, same_interpreter
from .spark_session import SessionFinder
from .sparkstart import (EMBEDDED_MARK, _active_context, context_conf,  # noqa: F401
                         embedded_session, local_slots)


def cluster_slots(sc):
    """How many tasks of the default resource profile can run at once right now."""
    jsc = pyspark_compat.scala_context(sc)
    if jsc is None:
        return sc.defaultParallelism
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # older Spark: no resource profiles
        return int(jsc.maxNumConcurrentTasks())


def _executor_summary(sc):
    jsc = pyspark_compat.scala_context(sc)
    if jsc is None:
        return ""
    try:
        executors = jsc.getExecutorIds().size()  # those holding slots, as counted
    except Exception:
        return ""
    conf = context_conf(sc)
    cores, task_cpus = conf.get("spark.executor.cores"), conf.get("spark.task.cpus", "1")
    text = f"{executors} executor{'s' if executors != 1 else ''}"
    if cores:
        text += f" × {cores} cores"
    if task_cpus != "1":
        text += f", {task_cpus} cpus per task"
    return text


def promised_slots(master, conf_get):
    """(the most task slots the session's settings allow, the setting that says so), or None
    where they set no bound: ``spark.cores.max`` on a standalone cluster, else
    ``spark.executor.instances`` with a known number of cores per executor."""
    task_cpus = int(conf_get("spark.task.cpus") or 1)
    cores = executor_cores(master, conf_get)
    cores_max = conf_get("spark.cores.max")
    if cores_max and master.startswith("spark://"):
        most = (int(cores_max) // cores * (cores // task_cpus) if cores  # whole executors
                else int(cores_max) // task_cpus)
        return most, f"spark.cores.max={cores_max}"
    instances = conf_get("spark.executor.instances")
    if instances and cores:
        return int(instances) * (cores // task_cpus), f"spark.executor.instances={instances}"
    return None


_WORKERS_PYTHON = threading.Lock()


@contextlib.contextmanager
def workers_python(sc):
    """Build a stage whose local Python workers run this very interpreter.

    A local session the user made without PYSPARK_PYTHON runs its workers on whatever `python3`
    is on PATH (not the kernel's virtualenv); its workers are on this machine, so they can run
    ours, which has torch, horovod and hvd_magic. PySpark reads `sc.pythonExec` when a stage's
    Python function is wrapped, so it is ours only while this stage is built."""
    if local_slots(sc.master) is None or same_interpreter(sc.pythonExec):
        yield
        return
    with _WORKERS_PYTHON:
        saved, sc.pythonExec = sc.pythonExec, sys.executable
        try:
            yield
        finally:
            sc.pythonExec = saved


class SparkLauncher(Launcher):
    """Runs `hvd_magic.task.spark_task` on N barrier tasks of a SparkSession."""

    # plain tasks (an elastic run's) may run with dynamic allocation: executors come as they ask
    plain_tasks = False

    def __init__(self, session=None, master=None, conf=None, slot_wait=30.0, log_dir="hvd_runs",
                 verbose=False):
        super().__init__()
        self.session = session
        self.slot_wait = slot_wait
        self.group = None
        self._cancelled = False
        # the session, where none was given: found or started by prepare()
        self._finder = SessionFinder(master, conf, log_dir, verbose, phase=self._set_phase,
                                     shared_cores=self._note_shared_cores)
        self._conf = None             # the session's SparkConf, read once (each read is a JVM copy)

    @property
    def log_path(self):
        """The log of the Spark JVM this launch started, or None."""
        return self._finder.log_path

    # -- before launch ----------------------------------------------------------------------
    def prepare(self, np):
        """Find or start the session and check it can hold N ranks at once."""
        if self.session is None:
            self.session = self._finder.find(np)
        if not self._finder.started_here:
            self._note_shared_cores(self.session.sparkContext.master, np)
        sc = self.session.sparkContext
        conf = self._conf = context_conf(sc)
        if conf.get("spark.dynamicAllocation.enabled", "false").lower() != "true":
            self._check_slots(sc, np)
        elif not self.plain_tasks:
            raise UsageError(
                "Spark's dynamic allocation is on, and barrier stages cannot run with it. Start the "
                "session with spark.dynamicAllocation.enabled=false (and a fixed number of "
                "executors), or make the run elastic (--min-np M), whose ranks are plain tasks.")
        self._ship(sc)
        self._set_phase(None)
        return self.session

    def _ship(self, sc):
        """What the ranks get of the notebook's environment on a cluster's executors (hvd_magic,
        the job's packages: `shipping`); nothing on a local session, whose executors run this
        very Python."""
        if self.wants is None or local_slots(sc.master) is not None:
            return
        imports, only = self.wants
        self._set_phase("packing hvd_magic and the job's packages for the executors")
        self.shipment, line = ship_to(sc, imports, only)
        if line:
            self._note(line)

    def _note_shared_cores(self, master, np):
        if local_slots(master) is not None:
            self._note_cores(np, f"on {master}")

    def _check_slots(self, sc, np):
        conf = self._conf or context_conf(sc)
        slots = local_slots(sc.master)
        if slots is not None:
            task_cpus = int(conf.get("spark.task.cpus") or 1)
            slots //= task_cpus
            if slots < np:
                per_task = f", {task_cpus} cpus per task" if task_cpus > 1 else ""
                raise UsageError(
                    f"np={np} but the Spark session ({sc.master}{per_task}) has "
                    f"{plural(slots, 'task slot')}; use --np {max(slots, 1)} or start the "
                    f"session with local[{np * task_cpus}].")
            return
        promise = promised_slots(sc.master, conf.get)
        if promise is not None and promise[0] < np:  # no need to wait for executors to see it
            most, setting = promise
            raise UsageError(f"np={np} but the session's {setting} allows at most {most} task "
                             f"slots; use --np {max(most, 1)} or raise {setting.split('=')[0]}.")
        # executors register a few seconds after a session starts: wait from its start, so that
        # a session that has been up for a while is judged at once (from when one we started was
        # ready: its JVM's own start time was 37 s before, on a loaded machine)
        deadline = max(sc.startTime / 1000, getattr(sc, "_hvd_magic_ready", 0)) + self.slot_wait
        while True:
            slots = cluster_slots(sc)
            if slots >= np or time.time() > deadline:
                break
            if self._cancelled:
                raise RunCancelled(f"Cancelled while waiting for {np} Spark task slots "
                                   f"({slots} free); no rank was started.")
            self._set_phase(f"waiting for {np} Spark task slots ({slots} free)")
            time.sleep(0.25)
        if slots < np:
            summary = _executor_summary(sc)
            raise UsageError(
                f"np={np} but the cluster has {plural(slots, 'task slot')}"
                + (f" ({summary})" if summary else "")
                + f"; use --np {max(slots, 1)} or add executors.")

    def _conf_get(self, key):
        conf = self._conf if self._conf is not None else context_conf(self.session.sparkContext)
        return conf.get(key)

    @property
    def driver_host(self):
        return self._conf_get("spark.driver.host") or "127.0.0.1"

    @property
    def bind_host(self):
        """Spark's own bind address when the session has one (the driver listens there)."""
        return self._conf_get("spark.driver.bindAddress") or super().bind_host

    @property
    def where(self):
        return self.session.sparkContext.master

    @property
    def executor_cores(self):
        return executor_cores(self.session.sparkContext.master, self._conf_get)

    def share(self, data):
        if local_slots(self.session.sparkContext.master) is not None:
            return payload.LocalFile(data)  # tasks on this machine: no broadcast file on disk
        return self.session.sparkContext.broadcast(payload.inband(data))

    def use_data(self, df, np, cache=None):
        self._set_phase("planning the --data DataFrame's shards")
        try:
            self.data = data_plan(
                df, np, lambda df: check_data(df, np, self.where, self._same_session),
                local=local_slots(self.session.sparkContext.master) is not None, cache=cache)
        finally:
            self._set_phase(None)

    def _same_session(self, df):
        """`df` runs on our SparkContext (a stopped session's DataFrame, or a Spark Connect
        one, does not)."""
        session = getattr(df, "sparkSession", None)
        return pyspark_compat.context_of(session) is self.session.sparkContext

    # -- launch -------------------------------------------------------------------------------
    def start(self, settings, np):
        from pyspark import InheritableThread

        sc = self.session.sparkContext
        self._claim(settings)

        def collect():
            try:
                sc.setJobGroup(self.group, f"hvd_magic run {settings.run_id} (np={np})",
                               interruptOnCancel=True)
                with workers_python(sc):
                    rdd = sc.parallelize(range(np), np).barrier().mapPartitions(
                        functools.partial(spark_task, settings))
                    pyspark_compat.wrap_python_function(rdd)  # now, with our interpreter
                self.outcomes = rdd.collect()
            except BaseException as exc:  # reported by the driver loop, never lost
                self.error = exc if self._cancelled else LaunchError(
                    java_message(exc, sc.pythonExec))
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)

        # PySpark's thread class, so that the job group reaches the JVM in pinned-thread mode.
        thread = InheritableThread(target=collect, name="hvd-magic-spark", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _claim(self, settings):
        """This run's job group; the session made the notebook's when it was started here."""
        self.group = f"hvd_magic-{settings.run_id}-{uuid.uuid4().hex[:6]}"
        if self._finder.started_here:
            # The session was started in the driver's helper thread (`Run._prepare`), and Spark's
            # active session is per thread: make it the notebook's too, as if the user had started
            # it, so that SparkSession.getActiveSession() in a later cell finds it.
            java_session = pyspark_compat.java_session(self.session)
            if java_session is not None:
                pyspark_compat.jvm().SparkSession.setActiveSession(java_session)

    def cancel(self):
        self._cancelled = True
        self._finder.cancel()  # prepare() may be starting Spark in the driver's helper thread
        if self.group is not None:
            try:
                self.session.sparkContext.cancelJobGroup(self.group)
            except Exception:
                pass

    def job_ids(self):
        """Spark job ids of this run's group (used by tests and the view)."""
        if self.group is None:
            return []
        return list(self.session.sparkContext.statusTracker().getJobIdsForGroup(self.group))
