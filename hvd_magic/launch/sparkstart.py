"""Starting the embedded Spark session: quietly, into a log file, and so that it can be cancelled.

PySpark starts its JVM (`pyspark.java_gateway.launch_gateway`) with the kernel's own stdout and
stderr, and ipykernel forwards whatever reaches those file descriptors into the running cell: the
JVM's "WARNING: Using incubator modules", Spark's "Setting default log level" and any later log4j
output would land under the user's first cell. `launch_gateway` takes ``popen_kwargs`` for exactly
this ("capturing stdout/stderr", its docstring says) and `SparkContext` takes the ``gateway``, so
the JVM writes to ``hvd_runs/spark-<time>.log`` instead; with ``verbose`` it is also shown in the
cell that started it. No PySpark function is patched.

PySpark keeps its JVM for the life of the process (a stopped session leaves it running and the
next session reuses it), so only the first start in a kernel launches a JVM and picks its log.
Our session on a JVM someone else launched has only its own settings, none of the launcher's
(`_launch_settings_hidden`); where ours name one that only a JVM's launch takes
(`spark.driver.memory`, packages: `LAUNCH_ONLY`) and that JVM, which no session uses any more,
was launched without it, that JVM is ended and ours launches one with it.

Cancelling (`SparkStart.cancel`, from another thread) while a JVM we launched is starting stops
that JVM, so that nothing is left running. Only that case tears PySpark's gateway down; a session
started on a JVM that was already there is stopped once it is up, and the JVM stays, as PySpark
leaves it after any ``spark.stop()``.

Also the settings of that session (`embedded_settings`: local[N], UI off, workers on this Python)
and what a master string says of its slots (`local_slots`).

Not for: choosing a session (`hvd_magic.launch.spark_session`) or checking its slots
(`hvd_magic.launch.spark`).
"""

import contextlib
import datetime
import os
import re
import sys
import threading
import time
import warnings

from ..compat import pyspark as pyspark_compat
from ..errors import LaunchError, RunCancelled

JVM_STOP_SECONDS = 10  # SIGTERM lets Spark's shutdown hooks remove its temporary folders

EMBEDDED_MARK = "spark.hvd_magic.embedded"
_LOG4J = os.path.join(os.path.dirname(__file__), "log4j2.properties")


def _active_context():
    return pyspark_compat.active_context()


def embedded_settings(np, conf=None, master=None):
    """The settings of the session we run on when the user has none: local[N], at least N slots."""
    slots = max(np * int((conf or {}).get("spark.task.cpus", 1)), os.cpu_count() or 1, 4)
    # PySpark starts its workers with $PYSPARK_PYTHON (default: whatever python3 is on PATH);
    # ours must be this very interpreter, which has torch, horovod and hvd_magic.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {
        "spark.master": master or f"local[{slots}]",
        "spark.app.name": "hvd_magic",
        EMBEDDED_MARK: "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{_LOG4J}",
        "spark.executor.extraJavaOptions": f"-Dlog4j.configurationFile=file:{_LOG4J}",
    }
    if master is None or master.startswith("local"):
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    settings.update({key: str(value) for key, value in (conf or {}).items()})
    return settings


def embedded_session(np, conf=None, master=None, log_dir="hvd_runs", verbose=False):
    """Start the embedded session now (the JVM's output to log_dir/spark-<time>.log)."""
    return _quiet(SparkStart(embedded_settings(np, conf, master), log_dir, verbose).session())


def _quiet(session):
    session.sparkContext.setLogLevel("ERROR")
    return session


def context_conf(sc):
    """The settings SparkContext `sc` runs with. (PySpark's `sc.getConf()` starts from the JVM's
    `spark.*` system properties: on a JVM another session launched, it shows that one's too.)"""
    scala = pyspark_compat.scala_context(sc)
    return pyspark_compat.conf_of(scala.getConf()) if scala is not None else sc.getConf()


def local_slots(master):
    """Task slots of a local master string, or None when it is not local."""
    if master == "local":
        return 1
    m = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if m:
        return os.cpu_count() if m.group(1) == "*" else int(m.group(1))
    m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if m:
        return int(m.group(1)) * int(m.group(2))
    return None



class SparkStart:
    """One start of a SparkSession from `settings` (key -> value, the master included)."""

    def __init__(self, settings, log_dir, verbose=False):
        self.settings = dict(settings)
        self.log_dir = log_dir
        self.verbose = verbose
        self.log_path = None         # where the JVM writes, when this start launched it
        self._lock = threading.Lock()
        self._cancelled = False
        self._gateway = None         # the gateway this start launched, while it may be undone
        self._launched = None        # the gateway this start launched, for good (`end_jvm`)
        self._own_jvm = None         # whether it launches a JVM of its own (once it knows)

    def session(self):
        """The started SparkSession; `RunCancelled` if `cancel` was called meanwhile."""
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession

        running = pyspark_compat.launched_gateway()
        if running is not None and _active_context() is None \
                and _fixed_at_launch(self.settings):  # a JVM no session uses, launched without
            _end_gateway(running)                   # them: ours launches one that has them
        conf = SparkConf(loadDefaults=False)  # (held by the JVM, where there is one)
        for key, value in self.settings.items():
            conf.set(key, str(value))
        gateway = None
        self._own_jvm = pyspark_compat.launched_gateway() is None
        if self._own_jvm:  # no JVM in this process yet: ours to launch
            # (without our mark: the JVM keeps its launch settings for every later session in
            # it, and a user's session made there once ours is stopped is not ours)
            launch = SparkConf(loadDefaults=False).setAll(
                (key, value) for key, value in conf.getAll() if key != EMBEDDED_MARK)
            gateway = self._launch_jvm(launch)
        try:
            with _launch_settings_hidden():
                context = SparkContext(conf=conf, gateway=gateway)
        except Exception:
            if self._cancelled:  # the JVM was stopped under it: that is the cancel
                self._undo()
                raise self.cancelled_error() from None
            raise
        with self._lock:
            if self._cancelled:
                with warnings.catch_warnings():  # (PySpark warns when the JVM is gone already)
                    warnings.simplefilter("ignore")
                    context.stop()
                self._undo()
                raise self.cancelled_error()
            self._gateway = None  # PySpark's own from now on
        # (when it could first ask for executors: its JVM's start time can be long before, on a
        # loaded machine; the launcher's wait for slots counts from the later: launch/spark.py)
        context._hvd_magic_ready = time.time()
        return SparkSession.builder.getOrCreate()

    def cancel(self):
        """Stop starting: the JVM this start launched is ended now (the waiting call then fails).
        True where its JVM is still being launched: the start then ends it itself, once up,
        before it is made PySpark's (nothing shared is touched: another start may go on)."""
        with self._lock:
            self._cancelled = True
            gateway = self._gateway
            launching = self._own_jvm is True and self._launched is None
        if gateway is not None:
            _end_process(gateway.proc)
        return launching

    # -- the JVM ----------------------------------------------------------------------------------
    def _launch_jvm(self, conf):
        from pyspark.java_gateway import launch_gateway

        if self._cancelled:  # (cancelled before its JVM was launched: none is)
            raise self.cancelled_error()
        os.makedirs(self.log_dir, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.log_path = os.path.abspath(os.path.join(self.log_dir, f"spark-{stamp}.log"))
        if self.verbose:
            # Through a pipe that a thread copies to the log and to this cell's stderr: a child's
            # own file descriptor 2 reaches the cell only as long as ipykernel attributes that
            # descriptor's output to it, which it stops doing once a subshell exists (a dashboard).
            read, write = os.pipe()
            threading.Thread(target=_copy_lines, args=(read, self.log_path, sys.stderr),
                             name="hvd-magic-spark-output", daemon=True).start()
            try:
                gateway = launch_gateway(conf, popen_kwargs={"stdout": write, "stderr": write})
            finally:
                os.close(write)  # the JVM holds its own copy; the thread ends when the JVM does
        else:
            # The JVM gets its own descriptor for the file; ours is closed once it has it.
            try:
                with open(self.log_path, "ab") as log:
                    gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
            except Exception as exc:  # (no Java, a bad setting): what it said is in the log
                raise LaunchError(f"Spark's JVM did not start ({exc}). It said, in "
                                  f"{self.log_path}:\n{_tail(self.log_path)}") from None
        with self._lock:
            self._gateway = self._launched = gateway
            cancelled = self._cancelled
        if cancelled:  # cancelled while the JVM came up (launch_gateway cannot be interrupted)
            self._undo()
            raise self.cancelled_error()
        return gateway

    def end_jvm(self):
        """End the JVM this start launched, once its session is stopped (a later session then
        launches a JVM of its own, with its own launch settings)."""
        _end_gateway(self._launched)
        self._launched = None

    def _undo(self):
        """End the JVM this start launched, and let PySpark launch a fresh one next time."""
        gateway, self._gateway = self._gateway, None
        _end_gateway(gateway)

    def cancelled_error(self):
        where = self.settings.get("spark.master", "Spark")
        return RunCancelled(
            f"Cancelled while starting Spark ({where}): no rank was started and the Spark it was "
            "starting was stopped. Run the cell again to start it.")


# What a JVM takes only when it is launched: a session made later in it cannot change them.
LAUNCH_ONLY = ("spark.driver.memory", "spark.driver.extraClassPath",
               "spark.driver.extraLibraryPath", "spark.jars", "spark.jars.packages",
               "spark.jars.repositories", "spark.jars.excludes")


def _fixed_at_launch(settings):
    """The `settings` that the running JVM was launched without (or with other values): on it
    they would not take effect."""
    system = pyspark_compat.jvm().System
    return [key for key in LAUNCH_ONLY
            if key in settings and str(settings[key]) != system.getProperty(key)]


@contextlib.contextmanager
def _launch_settings_hidden():
    """A JVM keeps the settings of the session that launched it as `spark.*` system properties,
    and every SparkContext made in it starts from them (PySpark's `SparkConf(_jvm=...)`): a user's
    session, stopped since, would give ours its spark.task.cpus or spark.cores.max. They are
    hidden while ours is made, and put back for the sessions the user makes next."""
    jvm = pyspark_compat.jvm()
    system = jvm.System if jvm is not None else None
    kept = {}
    if system is not None:
        for key in list(system.getProperties().stringPropertyNames()):
            if key.startswith("spark."):
                kept[key] = system.getProperty(key)
                system.clearProperty(key)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # (a cancelled start's JVM is gone, and they with it)
            for key, value in kept.items():
                system.setProperty(key, value)


def _end_gateway(gateway):
    if gateway is None:
        return
    try:
        gateway.shutdown()
    except Exception:  # the JVM is gone already; its sockets with it
        pass
    _end_process(gateway.proc)
    # PySpark has no call to drop a gateway; left in place, a dead one would make every later
    # start in this kernel fail.
    pyspark_compat.forget_gateway(gateway)


def _tail(path, lines=20):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:]).rstrip() or "(nothing)"


def _copy_lines(fd, log_path, shown):
    with os.fdopen(fd, "rb") as source, open(log_path, "ab", buffering=0) as log:
        for line in source:
            log.write(line)
            shown.write(line.decode(errors="replace"))
            shown.flush()


def _end_process(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(JVM_STOP_SECONDS)
    except Exception:  # subprocess.TimeoutExpired: a JVM that ignores SIGTERM
        proc.kill()
        proc.wait()
