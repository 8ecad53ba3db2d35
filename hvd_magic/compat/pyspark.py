"""PySpark's private attributes that the notebook side uses (classic Spark's JVM objects through
py4j, the process's gateway, Spark Connect's client) and the executor side's broadcast file.
Each is looked up, never assumed; where one is missing the caller does without it as the
function says, and `unavailable` says so once.

Imported only where pyspark is used already (launch/, data/, the terminal command; the task's
broadcast, lazily): the rank side never loads it. pyspark itself is imported inside functions.
"""

import contextlib
import io

from . import private, unavailable


def _context_class():
    from pyspark import SparkContext
    return SparkContext


def active_context():
    """The SparkContext this process runs now (``SparkContext._active_spark_context``), or None
    (where PySpark keeps none there: runs start their own session, or `spark=` names one)."""
    return private(_context_class(), "_active_spark_context", "pyspark",
                   "SparkContext._active_spark_context",
                   "a Spark session already running is not found; pass spark= to use it")


def jvm():
    """The py4j view of this process's JVM (``SparkContext._jvm``), or None (no JVM yet)."""
    return getattr(_context_class(), "_jvm", None)


def scala_context(sc):
    """`sc`'s Scala SparkContext (``sc._jsc.sc()``), or None (stopped, or none to read)."""
    if not hasattr(sc, "_jsc"):
        unavailable("pyspark", "SparkContext._jsc",
                    "the cluster's free slots and executors are estimated from "
                    "sc.defaultParallelism, and a session's settings read from sc.getConf()")
        return None
    return sc._jsc.sc() if sc._jsc is not None else None


def is_stopped(sc):
    """Whether `sc` was stopped (its Java context gone)."""
    return getattr(sc, "_jsc", None) is None


def java_dataframe(df):
    """A classic DataFrame's Java Dataset (``df._jdf``), or None (a Spark Connect DataFrame, or
    one that has none: its plan is not read, and it is written once into the data cache)."""
    found = getattr(df, "_jdf", None)
    if found is None and not type(df).__module__.startswith("pyspark.sql.connect"):
        unavailable("pyspark", "DataFrame._jdf",
                    "--data writes every DataFrame once into the cache, Parquet scans too")
    return found


def java_session(session):
    """A classic SparkSession's Java session (``session._jsparkSession``), or None."""
    return private(session, "_jsparkSession", "pyspark", "SparkSession._jsparkSession",
                   "a session started in the run's helper thread is not the notebook's active "
                   "session (SparkSession.getActiveSession() in a later cell)")


def context_of(session):
    """The SparkContext a classic SparkSession runs on (``session._sc``; a Connect session's
    ``sparkContext`` raises), or None."""
    return getattr(session, "_sc", None)


def explain_text(df):
    """``df.explain(extended=True)``'s text (``df._explain_string``; else what ``explain``
    prints, caught)."""
    explain = getattr(df, "_explain_string", None)
    if explain is not None:
        return explain(extended=True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        df.explain(extended=True)
    return printed.getvalue()


def wrap_python_function(rdd):
    """Have PySpark wrap `rdd`'s Python function for the JVM now (reading ``rdd._jrdd``), while
    the caller holds the workers' interpreter setting; False where it cannot."""
    if getattr(rdd, "_jrdd", None) is None:  # (a property: the wrapping is its side effect)
        unavailable("pyspark", "RDD._jrdd",
                    "the Spark workers run the Python that PYSPARK_PYTHON names as the job "
                    "starts")
        return False
    return True


def launched_gateway():
    """The py4j gateway PySpark launched in this process (``SparkContext._gateway``), or None."""
    return getattr(_context_class(), "_gateway", None)


def forget_gateway(gateway):
    """Have PySpark forget `gateway` (ended by us), so that a later start launches a fresh JVM:
    PySpark has no call for it, these are the class attributes its launch sets. False where
    they are not there: a later start in this process may find the dead JVM."""
    sc_class = _context_class()
    if not all(hasattr(sc_class, name) for name in ("_lock", "_gateway", "_jvm")):
        unavailable("pyspark", "SparkContext._gateway",
                    "a Spark session started after hvd_magic's JVM ended needs a new kernel")
        return False
    with sc_class._lock:
        if sc_class._gateway is gateway:
            sc_class._gateway = None
            sc_class._jvm = None
    return True


def conf_of(scala_conf):
    """A SparkConf over a Scala SparkConf (``SparkConf(_jconf=...)``)."""
    from pyspark import SparkConf
    return SparkConf(_jconf=scala_conf)


def instantiated_session():
    """The SparkSession this process made last (``SparkSession._instantiatedSession``), or None."""
    from pyspark.sql import SparkSession
    return getattr(SparkSession, "_instantiatedSession", None)


def connect_default_session():
    """Spark Connect's default session (``SparkSession._get_default_session``), or None."""
    from pyspark.sql.connect.session import SparkSession

    default = private(SparkSession, "_get_default_session", "pyspark",
                      "Spark Connect's default session",
                      "a Connect session is found only when it is the thread's active one")
    return default() if default is not None else None


def connect_port(session):
    """The port a Spark Connect session's client talks to (``client._builder._port``), or None
    (then only its host is shown)."""
    return private(getattr(session.client, "_builder", None), "_port", "pyspark",
                   "Spark Connect's port (client._builder._port)",
                   "a Connect run says its server's host without the port")


def pending_releases(session):
    """The Spark Connect client's ReleaseExecute calls still in flight
    (``client._release_futures``, 3.5 to 4.x), or () where it keeps none we can see."""
    client = getattr(session, "client", None)
    if client is not None and not hasattr(client, "_release_futures"):
        unavailable("pyspark", "Spark Connect's pending releases",
                    "a spark.stop() right after a run may log a server ERROR")
    return list(getattr(client, "_release_futures", None) or ())


def broadcast_file(ref):
    """The file an executor-side PySpark broadcast was left in (``Broadcast._path``), while its
    value is not loaded yet; else None."""
    if type(ref).__module__.startswith("pyspark") and type(ref).__name__ == "Broadcast" \
            and not hasattr(ref, "_path"):
        unavailable("pyspark", "Broadcast._path",
                    "each rank unpickles a shared value from its task, not from the "
                    "executor's file")
    path = getattr(ref, "_path", None)
    if not isinstance(path, str) or getattr(ref, "_value", None) is not None:
        return None
    return path
