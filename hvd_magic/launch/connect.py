"""Launch through a Spark Connect session (pyspark 4's ``SparkSession.builder.remote(...)``;
Databricks shared and serverless compute), which has no SparkContext to run an RDD from.

The ranks' stage is a DataFrame's: ``mapInArrow(frame_task, barrier=True)`` over
``spark.range(N)`` with N partitions, or over the ``--data`` DataFrame (`hvd_magic.data.frames`),
so every task runs the same `run_task` as a classic barrier task. Outcomes come back as rows of at
most 1 MiB (under the gRPC message limit); the stage carries a tag of its own, which `cancel`
interrupts. Large values travel inside the stage's plan (Connect has no broadcast).

pyspark's in-process form, ``SparkSession.builder.remote("local[N]")``, runs its server in this
process's JVM, on a classic local session: its Python workers are this machine's, as a classic
``local[N]`` session's are. When that server was started without ``PYSPARK_PYTHON`` (its workers
would run whatever ``python3`` is on PATH), the stage runs with ``PYSPARK_PYTHON`` set to this
very interpreter in the server's environment, where it reads it (`local_server_python`), as the
classic launcher does with ``sc.pythonExec``.

The executors of a remote Connect server may not be able to reach this notebook: the tasks find
out within seconds and then run offline (`hvd_magic.task.offline`); their events come back with
the outcomes (`late_events`), and the view says why the run was not live. The address the tasks
try is this machine's towards the server, or ``HVD_MAGIC_DRIVER_HOST`` when that is set.

Not for: anything the classic launcher does with a SparkContext (`hvd_magic.launch.spark`).
"""

import contextlib
import dataclasses
import functools
import os
import sys
import uuid

from IPython.core.error import UsageError

from ..compat import pyspark as pyspark_compat
from ..data.frames import check_data, data_plan
from ..errors import LaunchError
from ..task.connect_stage import OUTCOME_SCHEMA, frame_task, outcomes
from ..task.plan import _local_ip_towards, _resolve
from ..task.threads import executor_cores
from .base import Launcher


def connect_session(spark=None):
    """The Spark Connect session to launch through: `spark` if it is one, else the Connect
    session the user made (this thread's active one, or the default), whatever classic
    SparkContext also runs in this process; None otherwise.

    A classic SparkContext beside a Connect session is no sign of a classic user:
    ``SparkSession.builder.remote("local[2]")``, pyspark's documented way to try Connect, starts
    its Connect server inside this process on one."""
    if spark is not None:
        return spark if is_connect(spark) else None
    if "pyspark.sql.connect.session" not in sys.modules:  # no Connect session was ever made
        return None
    try:
        from pyspark.sql.connect.session import SparkSession
    except ImportError:  # the Connect client's packages (grpcio...) are not installed
        return None
    return SparkSession.getActiveSession() or pyspark_compat.connect_default_session()


def is_connect(spark):
    return type(spark).__module__.startswith("pyspark.sql.connect")


class ConnectLauncher(Launcher):
    """Runs `hvd_magic.task.connect_stage.frame_task` on N barrier tasks of a Spark Connect session."""

    offline_possible = True   # its tasks may not reach the notebook (the view says so)

    def __init__(self, session):
        super().__init__()
        self.session = session
        self.tag = None
        self.master = None
        self._cancelled = False

    def prepare(self, np):
        from .sparkstart import local_slots

        conf = self.session.conf
        self.master = conf.get("spark.master", None)
        if (conf.get("spark.dynamicAllocation.enabled", "false") or "").lower() == "true":
            raise UsageError(
                "The Spark Connect server runs with dynamic allocation, and barrier stages cannot "
                "run with it: start the server with spark.dynamicAllocation.enabled=false.")
        slots = local_slots(self.master) if self.master else None
        if slots is not None and slots < np:
            raise UsageError(f"np={np} but the Spark Connect server ({self.master}) has {slots} "
                             f"task slots; use --np {slots} or start it with local[{np}].")
        if self.master:
            self.executor_cores = executor_cores(self.master, lambda key: conf.get(key, None))
        return self.session

    @property
    def host(self):
        return getattr(self.session.client, "host", None) or "localhost"

    @property
    def where(self):
        port = pyspark_compat.connect_port(self.session)
        address = f"{self.host}:{port}" if port else self.host
        return f"Spark Connect {address}" + (f" ({self.master})" if self.master else "")

    @property
    def driver_host(self):
        """This machine's address as the Connect server's executors would reach it."""
        if os.environ.get("HVD_MAGIC_DRIVER_HOST"):
            return os.environ["HVD_MAGIC_DRIVER_HOST"]
        host = self.host.strip("[]")
        if host in ("localhost", "::1") or host.startswith("127."):
            return "127.0.0.1"
        return _local_ip_towards(_resolve(host))

    def use_data(self, df, np, cache=None):
        from .sparkstart import local_slots

        self._set_phase("planning the --data DataFrame's shards")
        try:
            local = self.master is not None and local_slots(self.master) is not None
            self.data = data_plan(df, np, lambda df: check_data(df, np, self.where, self._same_session),
                                  local=local, cache=cache)
        finally:
            self._set_phase(None)

    def _same_session(self, df):
        session = getattr(df, "sparkSession", None)
        return is_connect(session) and session.session_id == self.session.session_id

    def start(self, settings, np):
        self.tag = f"hvd_magic-{settings.run_id}-{uuid.uuid4().hex[:6]}"
        frame = self.session.range(0, np, 1, np)
        # The tasks check that they can reach this notebook, and run offline if not.
        settings = dataclasses.replace(settings, connect=True)
        self._in_background(self._collect, "hvd-magic-connect", frame, settings)

    def _collect(self, frame, settings):
        from .spark_errors import java_message

        self.session.addTag(self.tag)  # tags are per thread: this one's operations carry it
        try:
            with local_server_python(self.master):
                self.outcomes, self.late_events = collect_outcomes(barrier_stage(frame, settings))
        except BaseException as exc:  # reported by the driver loop, never lost
            self.error = exc if self._cancelled else LaunchError(
                java_message(exc, self.workers_python()))
        finally:
            self.session.removeTag(self.tag)
            released(self.session)

    def workers_python(self):
        """The interpreter the server's Python workers run: the server reads PYSPARK_PYTHON from
        its own environment (python3 when unset)."""
        python = self.session.conf.get("spark.pyspark.python", None)
        if python:
            return python
        env = _local_server_env(self.master)
        if env is not None:  # pyspark's in-process local server: its environment is at hand
            return env.get("PYSPARK_PYTHON") or env.get("PYSPARK_DRIVER_PYTHON") or "python3"
        return "the server's PYSPARK_PYTHON (python3 when it is not set)"

    def cancel(self):
        self._cancelled = True
        if self.tag is not None:
            try:
                self.session.interruptTag(self.tag)
            except Exception:
                pass


def released(session, timeout=10):
    """Wait (at most `timeout` seconds) for the client's ReleaseExecute calls still in flight.
    pyspark sends them from a thread pool once a result is read, and a ``spark.stop()`` right
    after the run closes the server's session first: a release arriving after that is logged by
    the server as an ERROR with its Java stack (in-process server: on the notebook's stderr).
    pyspark's own ``close()`` waits the same way, after the session is gone."""
    import concurrent.futures
    futures = pyspark_compat.pending_releases(session)
    if futures:
        concurrent.futures.wait(futures, timeout=timeout)


@contextlib.contextmanager
def local_server_python(master):
    """Run a stage whose Python workers, on pyspark's in-process local Connect server started
    without PYSPARK_PYTHON, run this very interpreter (which has torch, horovod and hvd_magic).

    That server takes the interpreter from its JVM's environment (``PYSPARK_PYTHON``, else
    ``PYSPARK_DRIVER_PYTHON``, else ``python3``) as it plans each request; the JVM is this
    process's, so the variable is set there for the stage and removed after it, leaving the
    user's server as it was. Any other server (a remote one, or one told its Python) is left
    alone: its workers are not ours to choose."""
    from .spark_errors import same_interpreter

    env = _local_server_env(master)
    if (env is None or env.get("PYSPARK_PYTHON") or env.get("PYSPARK_DRIVER_PYTHON")
            or same_interpreter("python3")):
        yield
        return
    env.put("PYSPARK_PYTHON", sys.executable)
    try:
        yield
    finally:
        if env.get("PYSPARK_PYTHON") == sys.executable:
            env.remove("PYSPARK_PYTHON")


def _local_server_env(master):
    """The environment of the JVM that serves pyspark's in-process local Connect session of
    `master` (a live, writable ``java.util.Map``), or None for any other server."""
    from .sparkstart import local_slots

    if "SPARK_LOCAL_REMOTE" not in os.environ or not master or local_slots(master) is None:
        return None
    from py4j.protocol import Py4JError

    sc = pyspark_compat.active_context()
    if sc is None or sc.master != master:
        return None
    try:
        # System.getenv() is a read-only view of the map it wraps (Spark opens java.util to
        # reflection, for its own use of it)
        view = pyspark_compat.jvm().java.lang.System.getenv()
        field = view.getClass().getDeclaredField("m")
        field.setAccessible(True)
        return field.get(view)
    except Py4JError:  # another JVM's layout: the stage runs as the server was started
        return None


def barrier_stage(frame, settings):
    """The barrier stage of `frame_task` over `frame`'s partitions, as a DataFrame to collect."""
    return frame.mapInArrow(functools.partial(frame_task, settings), OUTCOME_SCHEMA, barrier=True)


def collect_outcomes(stage):
    """Run the stage; (the tasks' outcomes in task order, the events of tasks that could not
    reach the driver, to be applied now)."""
    return outcomes(stage.collect())
