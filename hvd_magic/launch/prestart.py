"""The embedded Spark session, started in the background when the extension loads.

Starting Spark takes the first ``%%horovod --np N`` cell of a kernel several seconds (the JVM,
the SparkContext, Spark's first Python worker). `begin`, called by ``%load_ext hvd_magic``, does
that in a thread instead, so that a first cell typed a few seconds later finds the session ready;
the cell that needs it first waits for the rest (`SessionFinder` adopts it, and its Cancel ends
the start). Nothing is started where a session is the user's to choose: a SparkContext or a
Spark Connect session already there, Databricks, no Java, no pyspark, or
``HVD_MAGIC_PRESTART=0``.

PySpark hands an active session to every ``SparkSession.builder.getOrCreate()``, whatever master
or settings the builder names. So until a run has used it, the session is given up (its JVM too,
so that settings read at the JVM's launch count, ``spark.driver.memory`` or packages) where the
user's code makes a session of its own: ``SparkSession.Builder.getOrCreate`` and
``SparkContext.__init__`` are guarded while a start is ours (`_guard`), so a builder called from a
cell, a module or any thread first waits for the start to end or cancels it, stops what it made,
and then makes the session it was asked for; `hvd_magic.spark_session` does the same.

Not for: the start itself (`sparkstart.SparkStart`) or choosing a session for a run
(`spark_session.SessionFinder`).
"""

import functools
import os
import shutil
import sys
import threading

from ..words import plural

ENV = "HVD_MAGIC_PRESTART"

_current = None  # the Prestart of this process, until a run adopts it or it is given up
_releasing = threading.RLock()


def switched_off(environ=os.environ):
    """True where HVD_MAGIC_PRESTART=0: nothing is begun in the background at load."""
    return environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off")


def why_not(user_ns=None, environ=os.environ):
    """Why no session is started in the background here (a few words), or None: start one."""
    if switched_off(environ):
        return f"{ENV}=0"
    if environ.get("DATABRICKS_RUNTIME_VERSION") or environ.get("SPARK_REMOTE"):
        return "the platform's own session"
    from ..needs import installed
    if not installed("pyspark"):
        return "no pyspark"
    if not (shutil.which("java", path=environ.get("PATH")) or environ.get("JAVA_HOME")):
        return "no Java"
    if "pyspark.sql.connect.session" in sys.modules:  # a Connect session was made here
        return "Spark Connect is used"
    if "pyspark" in sys.modules:  # (not imported yet: no session can exist)
        from .sparkstart import _active_context
        if _active_context() is not None:
            return "a Spark session is active"
    if any(type(value).__module__.startswith("pyspark.sql.connect")
           for value in (user_ns or {}).values()):
        return "a Spark Connect session is active"
    return None


class Prestart:
    """One background start of the embedded session: `spark.embedded_settings` of `np` ranks and
    the user's `conf` (HorovodMagics.spark_conf)."""

    def __init__(self, np, conf, log_dir, hold=None):
        # Imported here, in the notebook's thread: a cell importing pyspark while the thread below
        # does would find it partly initialised (pyspark and pyspark.sql import each other).
        import pyspark.sql  # noqa: F401
        from .sparkstart import SparkStart, embedded_settings

        _guard()

        self.conf = dict(conf)
        self.hold = hold  # the modules the executors' rank template holds (None: no template)
        settings = embedded_settings(np, self.conf)
        self.master = settings["spark.master"]
        self.start = SparkStart(settings, log_dir)
        self.session = None
        self.error = None
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hvd-magic-spark-prestart",
                                        daemon=True)
        self.thread.start()

    def _run(self):
        from .sparkstart import _quiet, local_slots
        try:
            self.session = _quiet(self.start.session())
            # Spark's Python worker daemon starts with the first job: start it now too, and the
            # ranks' template of the executor, holding what the notebook imports.
            slots = local_slots(self.master) or 1
            work = self.session.sparkContext.parallelize(range(slots), slots)
            if self.hold is not None:
                work = work.mapPartitions(_holding(self.hold))
            work.count()
        except BaseException as exc:  # cancelled, or no Java after all: a run starts its own
            self.error = exc
        finally:
            self._done.set()

    def wait(self, timeout=None):
        """The session once started (None if the start failed or was cancelled)."""
        self._done.wait(timeout)
        return self.session if self._done.is_set() else None

    def give_up(self):
        """`cancel`, without waiting for a JVM still being launched: once up, that JVM sees the
        cancel and ends itself, touching nothing another start uses (so a bigger session can be
        started at once)."""
        if not self.start.cancel():
            self.cancel()

    def cancel(self):
        """End the start, or the started session and its JVM: nothing of it is left running."""
        self.start.cancel()
        self._done.wait()
        if self.session is not None:
            self.session.stop()
            self.start.end_jvm()
            self.session = None


def _holding(modules):
    """A Spark task's work: the executor's rank template started, holding `modules`
    (`hvd_magic.template`); its first run's ranks are then forked at once."""
    def hold(_partition):
        from ..task.environ import rank_base_env
        from ..template import client
        client.hold(rank_base_env(), modules)
        return iter(())
    return hold


def begin(user_ns=None, np=2, conf=None, log_dir="hvd_runs", hold=None):
    """Start the embedded session, with room for `np` ranks, in the background unless `why_not`
    (and with it the executor's rank template, holding the modules `hold`, where given); a line
    to say where it cannot be started for a reason the user should know (pyspark broken), else
    None (`current` and `describe` say what was started)."""
    global _current
    if _current is not None or why_not(user_ns) is not None:
        return None
    try:
        _current = Prestart(np, conf or {}, log_dir, hold)
    except Exception as exc:  # noqa: BLE001  (pyspark broken here: loading must not fail)
        return (f"hvd_magic: Spark cannot be started early: pyspark fails to import "
                f"({type(exc).__name__}: {exc}). --np -N cells run without it; a --np N cell "
                f"says what to do.")
    return None


def describe():
    """The background start's master, and its slots where they outnumber the cores."""
    from .sparkstart import local_slots
    slots, cores = local_slots(_current.master), os.cpu_count() or 1
    shared = (f": {slots} task slots, sharing this machine's {plural(cores, 'CPU core')}"
              if slots and slots > cores else "")
    return f"{_current.master}{shared}"


def current():
    """The background start no run has adopted yet, or None."""
    return _current


def adopt():
    """The background start for a run to wait on and keep (None if there is none): from now on
    the session is the run's, as if that run had started it."""
    global _current
    start, _current = _current, None
    return start


def release(reason):
    """Give up a background start no run has adopted (`reason`: what wants its own session);
    the line to say, or None if there was none."""
    global _current
    with _releasing:  # (a second builder waits until the first's release is done)
        start, _current = _current, None
        if start is None:
            return None
        start.cancel()
    return f"hvd_magic: stopped the Spark session it started in the background, for {reason}."


def _guard():
    """Make every session the user's code builds give up our background start first (once)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    for owner, name in ((SparkSession.Builder, "getOrCreate"), (SparkContext, "__init__")):
        original = getattr(owner, name)
        if not getattr(original, "_hvd_magic_guard", False):
            setattr(owner, name, _given_up_first(original))


def _given_up_first(original):
    @functools.wraps(original)
    def guarded(*args, **kwargs):
        with _releasing:
            start = _current
            if start is not None and threading.current_thread() is not start.thread:
                said = release("a Spark session of your own")
                if said:
                    print(said, file=sys.stderr)
        return original(*args, **kwargs)

    guarded._hvd_magic_guard = True
    return guarded
