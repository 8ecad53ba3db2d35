"""The plain Python API: `run(fn, np=...)` returns a finished `Run`. The magics are a thin shell
over it (`run_cell`), and so is every other way in.

What it does: checks the arguments, pickles the function and each value on its own
(`hvd_magic.capture.pickle_values`, so that everything that cannot travel is named before any
job starts), picks a launcher (`hvd_magic.launch.make_launcher`) and starts a `Run`
(`hvd_magic.driver.run`), which drives the launch to its end.
"""

import marshal
import os

from IPython.core.error import UsageError

from .capture import pickle_values
from .capture.modules import local_sources, names_in_code, names_in_imports, names_in_pickle
from .driver.history import last_run, runs
from .driver.tracking import tracked
from .driver.run import DEFAULT_BROADCAST_BYTES, DEFAULT_HOROVOD_ENV, DEFAULT_STALL_TIMEOUT, Run
from .launch import make_launcher
from .payload import cloud_dumps, inband

__all__ = ["run", "run_cell", "launch", "check_np", "last_run", "runs", "Run", "start_session",
           "run_in_session", "spark_session"]


def spark_session(master=None, conf=None, log_dir="hvd_runs", verbose=False):
    """A SparkSession for the notebook's own DataFrames, started as hvd_magic starts its own: what
    the JVM prints goes to ``log_dir/spark-<time>.log`` (not under the cell, where a notebook shows
    it as red stderr), no console progress bars, ERROR-level logs, Spark's Python workers on this
    interpreter. The active session if there is one. It is yours: hvd_magic never stops it for a
    run that needs more slots (that run gets a UsageError saying so).

    `master`: default ``local[N]``, N the machine's cores (at least 4); `conf`: more settings.

    Examples
    --------
    >>> spark = hvd_magic.spark_session("local[2]")
    >>> df = spark.read.parquet("data.parquet")
    """
    from .launch.spark import EMBEDDED_MARK, _active_context, embedded_session

    if _active_context() is not None:
        from pyspark.sql import SparkSession
        return SparkSession.builder.getOrCreate()
    return embedded_session(1, dict(conf or {}, **{EMBEDDED_MARK: "false"}), master,
                            log_dir=log_dir, verbose=verbose)


def check_np(np):
    if isinstance(np, bool) or not isinstance(np, int) or np == 0:
        raise UsageError(f"np must be a non-zero whole number (N ranks on Spark, -N for N ranks on "
                         f"the driver only), not {np!r}.")
    return np


def _shipped(pickles, import_lines=(), code=None):
    """The notebook's own modules the job will import, as sources to ship with it."""
    names = names_in_imports(import_lines) | (names_in_code(code) if code is not None else set())
    for data in pickles:
        names |= names_in_pickle(getattr(data, "head", data))  # an OutOfBand: its pickle
    return local_sources(names)


def run(fn, np=2, args=(), kwargs=None, *, spark=None, master=None, spark_conf=None,
        timeout=None, run_dir=None, view=None, background=False, horovod_env=None, env=None,
        broadcast_bytes=DEFAULT_BROADCAST_BYTES, retries=0, name=None, timeline=False,
        stall_timeout=DEFAULT_STALL_TIMEOUT, on_stall="warn", tensorboard=None,
        verbose=False, data=None, equal_shards=False, data_cache=None, mlflow=None,
        min_np=None, max_np=None, elastic_timeout=None):
    """Run `fn(*args, **kwargs)` on `np` Horovod ranks; return the finished `Run`.

    `np` > 0 runs N ranks as one Spark barrier stage (the active SparkSession, or an embedded
    ``local[N]`` one); `np` < 0 runs -np ranks as processes of this machine, without Spark.
    Raises `RankError` with the first failing rank's traceback; `UsageError` for bad arguments.
    `data`: a Spark DataFrame; each rank reads a disjoint shard of its rows from Parquet files,
    with `hvd_magic.shard()` or the batch functions (`equal_shards`: as many rows on every rank,
    the rest dropped; `data_cache`: where a DataFrame that is not plain Parquet is converted).
    `mlflow`: see `launch`.
    `min_np` makes the run elastic: Horovod's elastic driver runs here, a lost rank process (or
    executor) is replaced and the others go on from their last commit (code written with
    `hvd.elastic.run` and a `State`); fewer than `min_np` ranks for longer than
    `elastic_timeout` seconds ends the run. `max_np`: at most this many ranks (on Spark, ranks
    beyond `np` join when Spark has room for them).

    Examples
    --------
    >>> def total():
    ...     import torch, horovod.torch as hvd
    ...     hvd.init()
    ...     return hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
    >>> hvd_magic.run(total, np=2).results
    [3.0, 3.0]
    """
    check_np(np)
    if not callable(fn):
        raise UsageError(f"fn must be callable, not {type(fn).__name__}.")
    values = {f"argument {i}": a for i, a in enumerate(args)}
    values.update({f"keyword {k}": v for k, v in (kwargs or {}).items()})
    pickled = pickle_values({"the function": fn, **values}, kind="value")
    job = {"fn": inband(pickled["the function"]),
           "args": [inband(pickled[f"argument {i}"]) for i in range(len(args))],
           "sources": {}, "modules": _shipped(pickled.values(), code=fn)}
    kwargs_pickled = {k: pickled[f"keyword {k}"] for k in (kwargs or {})}
    return launch(job, kwargs_pickled, np, spark=spark, master=master, spark_conf=spark_conf,
                  timeout=timeout, run_dir=run_dir, view=view, background=background,
                  horovod_env=horovod_env, env=env, broadcast_bytes=broadcast_bytes,
                  retries=retries, name=name, timeline=timeline, stall_timeout=stall_timeout,
                  on_stall=on_stall, tensorboard=tensorboard, verbose=verbose, data=data,
                  equal_shards=equal_shards, data_cache=data_cache, mlflow=mlflow,
                  min_np=min_np, max_np=max_np, elastic_timeout=elastic_timeout)


def check_elastic(np, min_np, max_np, elastic_timeout):
    """(min_np, max_np, timeout) of an elastic run, or None when `min_np` is None."""
    if min_np is None:
        if max_np is not None or elastic_timeout is not None:
            raise UsageError("--max-np and --elastic-timeout belong to an elastic run: add "
                             "--min-np M (the fewest ranks the run may go on with).")
        return None
    max_np = abs(np) if max_np is None else max_np
    for name, value in (("min_np", min_np), ("max_np", max_np)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be a whole number of ranks >= 1, not {value!r}.")
    if not min_np <= abs(np) <= max_np:
        raise UsageError(f"an elastic run needs min_np <= ranks <= max_np; got min_np {min_np}, "
                         f"{abs(np)} ranks, max_np {max_np}.")
    if elastic_timeout is not None and elastic_timeout <= 0:
        raise UsageError(f"elastic_timeout takes a positive number of seconds, not {elastic_timeout!r}.")
    return min_np, max_np, elastic_timeout


def run_cell(cell_fn, np, **options):
    """Run a captured cell (`hvd_magic.capture.CellFunction`) on `np` ranks; see `run`."""
    pickled = pickle_values(dict(cell_fn.values))
    job = {"fn": cloud_dumps(cell_fn.fn), "args": [], "sources": cell_fn.sources,
           "cell": True, "export": list(cell_fn.export),
           "modules": _shipped(pickled.values(), cell_fn.imports, cell_fn.fn)}
    return launch(job, pickled, np, cell=cell_fn, **options)


def launch(job, kwargs_pickled, np, *, spark=None, master=None, spark_conf=None, timeout=None,
           run_dir=None, view=None, background=False, horovod_env=None, env=None,
           broadcast_bytes=DEFAULT_BROADCAST_BYTES, retries=0, name=None, cell=None,
           timeline=False, stall_timeout=DEFAULT_STALL_TIMEOUT, on_stall="warn",
           run_root="hvd_runs", tensorboard=None, verbose=False, data=None, equal_shards=False,
           data_cache=None, mlflow=None, min_np=None, max_np=None, elastic_timeout=None):
    """Start a pickled job on `np` ranks with the launcher `np` asks for; return the `Run`.
    A Spark JVM started now writes to run_root/spark-<time>.log (and to stderr if `verbose`).
    `mlflow`: None logs to the notebook's active MLflow run if there is one, True or an
    experiment's name to a new run, False never (`hvd_magic.driver.tracking`)."""
    elastic = check_elastic(np, min_np, max_np, elastic_timeout)
    if data is not None:
        _check_data_arg(data)
        if np < 0:
            raise UsageError("data= needs Spark: the shards are made by Spark's executors. Use "
                             f"np={-np} (a Spark barrier stage) instead of np={np}.")
    view, env = tracked(mlflow, view, env, job, cell, {
        "timeout": timeout, "timeline": timeline, "retries": retries, "name": name,
        "data": data is not None or None})
    if elastic is not None and data is not None:
        raise UsageError("data= is not available in elastic runs yet: read the data in the "
                         "function (e.g. with hvd.elastic.ElasticSampler), or leave out min_np.")
    launcher = make_launcher(np, spark=spark, master=master, spark_conf=spark_conf,
                             log_dir=run_root, verbose=verbose, elastic=elastic)
    # an elastic run on Spark has a row per slot it may fill (max_np); on the driver, -np rows
    rows = elastic[1] if elastic is not None and np > 0 else abs(np)
    run_ = Run(rows, run_dir=run_dir, launcher=launcher, view=view, timeout=timeout, cell=cell,
               horovod_env=horovod_env, extra_env=env, broadcast_bytes=broadcast_bytes,
               allow_retry=retries > 0, name=name, timeline=timeline,
               stall_timeout=stall_timeout, on_stall=on_stall, run_root=run_root,
               tensorboard=tensorboard and os.path.abspath(tensorboard), data=data,
               equal_shards=equal_shards, data_cache=data_cache, elastic=elastic)
    return run_.launch(job, kwargs_pickled, background=background)


def start_session(np=2, *, spark=None, master=None, spark_conf=None, horovod_env=None, env=None,
                  idle_timeout=None, progress=None, min_np=None):
    """Start a warm session of `np` ranks (placed as `run` places them) and wait until every
    rank is ready; return the `Session`. Its ranks keep their state between cells.

    `min_np` makes it elastic: a lost rank process (or executor) no longer ends the
    session; the survivors keep their namespaces, Horovod is reset on them before the next
    cell (`hvd.size()` is then smaller), and the session ends when fewer than `min_np` are left.
    Lost ranks are not replaced."""
    import atexit

    from .driver.session import Session

    check_np(np)
    elastic = check_elastic(np, min_np, None, None)
    launcher = make_launcher(np, spark=spark, master=master, spark_conf=spark_conf,
                             elastic=elastic, session=True)
    session = Session(launcher, abs(np), horovod_env={**DEFAULT_HOROVOD_ENV, **(horovod_env or {})},
                      extra_env=dict(env or {}), idle_timeout=idle_timeout, elastic=elastic)
    session.start(progress=progress)
    atexit.register(session.stop)  # the kernel's exit ends the ranks and frees the slots
    return session


def _check_data_arg(data):
    from .launch.frames import is_dataframe
    if not is_dataframe(data):
        raise UsageError(f"data= takes a Spark DataFrame, not a {type(data).__name__}; pass "
                         "other values as arguments (or name them in the cell).")


def run_in_session(session, cell, *, view=None, timeout=None, background=False, name=None,
                   broadcast_bytes=DEFAULT_BROADCAST_BYTES, stall_timeout=DEFAULT_STALL_TIMEOUT,
                   on_stall="warn", run_root="hvd_runs", data=None, equal_shards=False,
                   data_cache=None, mlflow=None):
    """Run a captured session cell (`hvd_magic.capture.session.SessionCell`) on the session's
    ranks; return the finished `Run`, as `run` does. `data`: as for `run`, for this cell (and
    the session's later cells, until another `data`)."""
    from .launch.session import SessionLauncher

    if data is not None:
        _check_data_arg(data)
    pickled = pickle_values(dict(cell.values))
    job = {"code": cell.code, "assigns": list(cell.assigns), "sources": cell.sources,
           "export": list(cell.export),
           "modules": _shipped(pickled.values(), cell.imports, marshal.loads(cell.code))}
    # (the session's ranks started without MLFLOW_* variables: only the driver logs)
    view, _ = tracked(mlflow, view, None, job, cell, {"timeout": timeout, "name": name})
    run_ = Run(session.np, launcher=SessionLauncher(session), view=view, timeout=timeout,
               cell=cell, broadcast_bytes=broadcast_bytes, name=name,
               stall_timeout=stall_timeout, on_stall=on_stall, run_root=run_root, data=data,
               equal_shards=equal_shards, data_cache=data_cache, elastic=session.elastic)
    try:
        return run_.launch(job, pickled, background=background)
    finally:
        if run_.started is not None:  # the ranks ran it (or began to): what it bound is theirs
            session.remember(cell)
