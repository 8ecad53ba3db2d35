"""The plain Python API: `run(fn, np=...)` returns a finished `Run`. The magics are a thin shell
over it (`run_cell`), and so is every other way in.

What it does: checks the arguments (once, into a `Placement` and `RunOptions`:
`hvd_magic.config`), pickles the function and each value on its own
(`hvd_magic.capture.pickle_values`, so that everything that cannot travel is named before any
job starts), picks a launcher (`hvd_magic.launch.make_launcher`) and starts a `Run`
(`hvd_magic.driver.run`), which drives the launch to its end.
"""

import marshal
import sys

from IPython.core.error import UsageError

from .capture import pickle_values
from .capture.modules import local_sources, names_in_code, names_in_imports, names_in_pickle
from .capture.reading import read_job
from .driver.history import last_run, runs
from .driver.tracking import tracked
from .driver.run import DEFAULT_HOROVOD_ENV, DEFAULT_RANK_ENV, Run
from .launch import make_launcher
from .config import (DEFAULT_BROADCAST_BYTES, DEFAULT_STALL_TIMEOUT, Placement, RunOptions,
                      check_np, check_together, split)
from .needs import RANKS_HERE, installed, missing_message
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
    from .launch import prestart
    from .launch.spark import EMBEDDED_MARK, _active_context, embedded_session

    said = prestart.release("hvd_magic.spark_session()")  # (not a session the user can keep)
    if said:
        print(said, file=sys.stderr)
    if _active_context() is not None:
        from pyspark.sql import SparkSession
        return SparkSession.builder.getOrCreate()
    return embedded_session(1, dict(conf or {}, **{EMBEDDED_MARK: "false"}), master,
                            log_dir=log_dir, verbose=verbose)


def _shipped(pickles, import_lines=(), code=None, values=None):
    """What the job brings with it and needs: {"modules": the notebook's own, as sources to ship
    with it (found from every name it may import: a name too many costs a look-up), "imports":
    the modules its code imports or reaches (which the ranks' template holds:
    hvd_magic.template), "reading": the `JobReading` every decision reads, dropped before the
    job is sent}."""
    names = names_in_imports(import_lines) | (names_in_code(code) if code is not None else set())
    for data in pickles:
        names |= names_in_pickle(getattr(data, "head", data))  # an OutOfBand: its pickle
    modules = local_sources(names)
    reading = read_job(code, values, modules, pickles)
    return {"modules": modules, "imports": sorted(reading.imports), "reading": reading}


def _reading(job):
    """The job's `JobReading`, taken out of it (what only the driver reads); a script's, or a job
    made elsewhere, read from its sources."""
    reading = job.pop("reading", None)
    if reading is None:
        sources = {**(job.get("sources") or {}), **(job.get("modules") or {})}
        reading = read_job(sources=sources)
        job.setdefault("imports", sorted(reading.imports))
    return reading


def run(fn, np=2, args=(), kwargs=None, *, spark=None, master=None, spark_conf=None,
        timeout=None, run_dir=None, view=None, background=False, horovod_env=None, env=None,
        broadcast_bytes=DEFAULT_BROADCAST_BYTES, retries=0, name=None, timeline=False,
        timeline_steps=None, timeline_detail=None,
        stall_timeout=DEFAULT_STALL_TIMEOUT, on_stall="warn", tensorboard=None,
        verbose=False, data=None, equal_shards=False, data_cache=None, mlflow=None,
        min_np=None, max_np=None, elastic_timeout=None, restart_from_scratch=False,
        frozen_timeout=None, fresh=None,
        ship=None):
    """Run `fn(*args, **kwargs)` on `np` Horovod ranks; return the finished `Run`.

    `np` > 0 runs N ranks as one Spark barrier stage (the active SparkSession, or an embedded
    ``local[N]`` one); `np` < 0 runs -np ranks as processes of this machine, without Spark.
    Raises `RankError` with the first failing rank's traceback; `UsageError` for bad arguments.
    `data`: a Spark DataFrame; each rank reads a disjoint shard of its rows from Parquet files,
    with `hvd_magic.shard()` or the batch functions (`equal_shards`: as many rows on every rank,
    the rest dropped; `data_cache`: where a DataFrame that is not plain Parquet is converted).
    `mlflow`: None logs to the notebook's active MLflow run if there is one, True or an
    experiment's name to a new run, False never (`hvd_magic.driver.tracking`).
    `min_np` makes the run elastic: Horovod's elastic driver runs here, a lost rank process (or
    executor) is replaced and the others go on from their last commit (code written with
    `hvd.elastic.run` and a `State`); fewer than `min_np` ranks for longer than
    `elastic_timeout` seconds ends the run. `max_np`: at most this many ranks (on Spark, ranks
    beyond `np` join when Spark has room for them). Every rank lost at once takes their state
    with it: the run fails, naming what was lost, unless `restart_from_scratch` lets the
    replacements start over from step 0. `frozen_timeout`: a rank alive but frozen (no CPU)
    while the others waited this long in a collective is killed and lost (default 120).
    `fresh`: every rank a new interpreter that imports its frameworks itself, not a fork of
    the host's template (`hvd_magic.template`); None: `hvd_magic.config.fresh_by_default`.
    `ship`: what goes to a cluster's executors that lack it (`hvd_magic.launch.shipping`): None
    hvd_magic and the distributions `fn` imports, "none" hvd_magic alone, or names.
    Every option is a field of `hvd_magic.config.Placement` or `RunOptions`, checked (alone
    and together) before anything starts.

    Examples
    --------
    >>> def total():
    ...     import torch, horovod.torch as hvd
    ...     hvd.init()
    ...     return hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
    >>> hvd_magic.run(total, np=2).results
    [3.0, 3.0]
    """
    # every keyword but the call's own is a field of Placement or RunOptions (hvd_magic.config)
    given = {k: v for k, v in locals().items()
             if k not in ("fn", "np", "args", "kwargs", "view", "background")}
    placement, options = split(np, **given)
    if not callable(fn):
        raise UsageError(f"fn must be callable, not {type(fn).__name__}.")
    if view is not None and not all(hasattr(view, m) for m in ("start", "event", "finish")):
        raise UsageError(f"view takes a view (hvd_magic.view.TextView(quiet=True), say) or None "
                         f"(the dashboard, or text), not {view!r}.")
    values = {f"argument {i}": a for i, a in enumerate(args)}
    values.update({f"keyword {k}": v for k, v in (kwargs or {}).items()})
    pickled = pickle_values({"the function": fn, **values}, kind="value")
    job = {"fn": inband(pickled["the function"]),
           "args": [inband(pickled[f"argument {i}"]) for i in range(len(args))],
           "sources": {}, **_shipped(pickled.values(), code=fn, values=values)}
    kwargs_pickled = {k: pickled[f"keyword {k}"] for k in (kwargs or {})}
    return launch(job, kwargs_pickled, placement, options, view=view, background=background)


def run_cell(cell_fn, placement, options, *, view=None, background=False):
    """Run a captured cell (`hvd_magic.capture.CellFunction`) as `placement` and `options`
    say (`hvd_magic.config`); see `run`."""
    pickled = pickle_values(dict(cell_fn.values))
    job = {"fn": cloud_dumps(cell_fn.fn), "args": [], "sources": cell_fn.sources,
           "cell": True, "export": list(cell_fn.export),
           **_shipped(pickled.values(), cell_fn.imports, cell_fn.fn, cell_fn.values)}
    return launch(job, pickled, placement, options, view=view, background=background,
                  cell=cell_fn)


def launch(job, kwargs_pickled, placement, options, *, view=None, background=False, cell=None):
    """Start a pickled job as `placement` and `options` say (`hvd_magic.config`, checked
    together here once more: a front door may have made them apart); return the `Run`."""
    placement, options = check_together(placement, options)
    reading = _reading(job)
    kind = elastic_kind(reading, job) if placement.elastic is not None else None
    profile = profile_plan(reading, job, options)
    refuse_without_horovod(reading, job, placement, options, kind, profile)
    view, env = tracked(options.mlflow, view, options.env, job, cell, options.tracked())
    launcher = make_launcher(placement, elastic_kind=kind)
    launcher.wants = (job.get("imports") or (), options.ship)  # (a cluster's: launch/shipping.py)
    run_ = Run(placement.rows, options, launcher=launcher, view=view, cell=cell, env=env,
               elastic=placement.elastic, frozen_timeout=placement.frozen_timeout,
               profile=profile)
    return run_.launch(job, kwargs_pickled, background=background)


def elastic_kind(reading, job):
    """Which elastic run ``--min-np`` makes of a job, from what its code uses (`reading`):
    ``"torch"`` for `hvd_magic.elastic` (our membership re-forms the torch.distributed group
    inside ``elastic.run``: `hvd_magic.launch.elastic.ddp`), ``"horovod"`` for Horovod code
    (Horovod's elastic driver runs here and re-forms its ring inside ``hvd.elastic.run``). Code
    that uses both elastic APIs, or neither framework, gets a UsageError saying what to do."""
    what = "script" if job.get("script") else "cell" if job.get("cell") else "function"
    if reading.ours_elastic and reading.horovod_elastic:
        raise UsageError(
            f"This {what} uses two elastic APIs, Horovod's (hvd.elastic) and hvd_magic.elastic: "
            f"one run can re-form only one kind of world. Keep hvd_magic.elastic for "
            f"torch.distributed (docs/elastic_ddp.md), or Horovod's for Horovod's collectives "
            f"(docs/elastic.md).")
    if not reading.horovod_elastic and (reading.uses("jax") or reading.uses("deepspeed")):
        raise UsageError(
            f"--min-np makes an elastic run, and this {what} uses "
            f"{'JAX' if reading.uses('jax') else 'DeepSpeed'}, whose world cannot change within "
            f"a run here (JAX's distributed runtime is made once per process; DeepSpeed's engine "
            f"holds its ZeRO partitions for one world). Drop --min-np: a lost rank then ends the "
            f"run with its error, and you rerun it from your last checkpoint "
            f"(DeepSpeed: engine.save_checkpoint / load_checkpoint).")
    if reading.ours_elastic:
        return "torch"
    if reading.horovod:
        return "horovod"
    raise UsageError(
        f"--min-np makes an elastic run: a lost rank is replaced and the survivors go on from "
        f"their last commit, inside a training function that knows how to. This {what} has "
        f"none: use hvd_magic.elastic (a TorchState, state.commit() and @elastic.run around "
        f"the training loop: docs/elastic_ddp.md) for torch.distributed, or Horovod's elastic "
        f"API (hvd.elastic.run and a State: docs/elastic.md). Or drop --min-np: a lost rank "
        f"then ends the run with its error, and you rerun it from your last checkpoint.")


# (in this order: JAX before TensorFlow, whose tf.data a JAX loop often reads)
PROFILED = {"torch": ("torch", "lightning", "pytorch_lightning", "accelerate"),
            "jax": ("jax", "flax"), "tensorflow": ("tensorflow", "keras", "tf_keras")}
DETAIL = {"torch": ("shapes", "stacks", "memory"), "tensorflow": ("stacks",), "jax": ("stacks",)}


def profile_plan(reading, job, options):
    """What ``--timeline`` records of a job that uses no Horovod: its framework's profiler on
    every rank over a window of steps ({"framework", "skip", "steps", "detail"}:
    `hvd_magic.rank.profile`); torch where the job imports it, else JAX, else TensorFlow. None where
    Horovod's timeline is recorded, or no timeline is asked for. A job that uses none of them
    gets a UsageError saying what to do."""
    if not options.timeline:
        return None
    if reading.horovod:
        if options.timeline_detail:
            raise UsageError("--timeline-detail chooses what torch's or TensorFlow's profiler "
                             "records; this job uses Horovod, whose timeline has no such "
                             "choice: drop --timeline-detail.")
        return None
    roots = {name.split(".")[0] for name in reading.imports}
    framework = next((f for f, names in PROFILED.items() if roots & set(names)), None)
    what = "script" if job.get("script") else "cell" if job.get("cell") else "function"
    if framework is None:
        raise UsageError(
            f"--timeline records Horovod's timeline (code that uses Horovod), torch's profiler "
            f"(code that imports torch, Lightning or accelerate) or TensorFlow's (code that "
            f"imports tensorflow or keras) or JAX's (code that imports jax); this {what} uses none "
            f"of them.")
    extra = [d for d in options.timeline_detail if d not in DETAIL[framework]]
    if extra:
        raise UsageError(f"--timeline-detail {','.join(extra)}: {framework}'s profiler records "
                         f"only {', '.join(DETAIL[framework])} besides each operator's time.")
    first, last = (int(n) for n in options.timeline_steps.split(":"))
    return {"framework": framework, "skip": first - 1, "steps": last - first + 1,
            "detail": list(options.timeline_detail)}


def refuse_without_horovod(reading, job, placement, options, elastic=None, profile=None):
    """What needs Horovod where it is not installed, said before anything starts: a Horovod
    elastic run (`elastic`: Horovod's elastic driver runs here), and where the ranks run on this very Python (``--np
    -N``, a local Spark session), a job that imports Horovod or records its timeline. Elsewhere
    the executors' Python decides, and a rank that lacks it says so (`driver.ending`)."""
    if installed("horovod"):
        return
    if elastic == "horovod":
        _refuse("--min-np on Horovod code (an elastic run: Horovod's elastic driver runs in "
                "this notebook)")
    if not _ranks_run_here(placement):
        return
    uses = sorted(n for n in reading.modules if n.split(".")[0] == "horovod")
    what = "script" if job.get("script") else "cell" if job.get("cell") else "function"
    if uses:
        _refuse(f"This {what} imports {uses[0]}: it", where=RANKS_HERE)
    if options.timeline and profile is None:
        _refuse("--timeline (Horovod's timeline, recorded by the ranks)", where=RANKS_HERE)


def _refuse(needed_by, **where):
    raise UsageError(missing_message("horovod", needed_by, **where))


def _ranks_run_here(placement):
    """Whether the ranks run this very interpreter: on the driver, or in a local Spark session
    (ours sets its Python workers to this one)."""
    if placement.np < 0:
        return True
    if placement.spark is not None:
        return False
    master = placement.master
    if master is None:  # the active session's, if any (none unless pyspark was imported)
        context = None
        if "pyspark" in sys.modules:
            from .launch.spark import _active_context
            context = _active_context()
        master = context.master if context is not None else "local"
    return master.startswith("local")


def start_session(np=2, *, spark=None, master=None, spark_conf=None, horovod_env=None, env=None,
                  idle_timeout=None, progress=None, min_np=None, fresh=None, debug=False,
                  elastic_api=None, ship=None):
    """Start a warm session of `np` ranks (placed as `run` places them) and wait until every
    rank is ready; return the `Session`. Its ranks keep their state between cells.

    `min_np` makes it elastic: a lost rank process (or executor) no longer ends the
    session; the survivors keep their namespaces, Horovod is reset on them before the next
    cell (`hvd.size()` is then smaller), and the session ends when fewer than `min_np` are left.
    Lost ranks are not replaced. `elastic_api`: ``"horovod"`` (Horovod's elastic driver resets
    Horovod's ring) or ``"torch"`` (ours re-forms the torch.distributed group:
    `hvd_magic.launch.elastic.ddp`); None: Horovod's where Horovod is installed. `fresh`: start the ranks as new interpreters, not forked from
    the template (`hvd_magic.template`; None: `hvd_magic.config.fresh_by_default`).

    `ship`: on a cluster, the distributions the session's cells will import, sent with
    hvd_magic to executors that lack them (`run`'s `ship`; its cells are not known yet).

    `debug`: a rank whose cell raises is held in pdb at its exception (``%horovod_debug``,
    `hvd_magic.driver.debugger`) until released with ``c`` or ``q``."""
    import atexit

    from .driver.session import Session

    placement = Placement(np, spark=spark, master=master, spark_conf=spark_conf, min_np=min_np)
    kind = elastic_api or ("horovod" if installed("horovod") else "torch")
    if kind not in ("horovod", "torch"):
        raise UsageError(f'elastic_api is "horovod" or "torch", not {elastic_api!r}.')
    if placement.elastic is not None and kind == "horovod" and not installed("horovod"):
        _refuse("An elastic Horovod session (--min-np)")
    launcher = make_launcher(placement, session=True, elastic_kind=kind)
    launcher.wants = ((), RunOptions(ship=ship).ship)
    session = Session(launcher, placement,
                      horovod_env={**DEFAULT_HOROVOD_ENV, **(horovod_env or {})},
                      extra_env={**DEFAULT_RANK_ENV, **(env or {})},  # as a run's ranks get
                      idle_timeout=idle_timeout, fresh=fresh, debug=debug)
    session.start(progress=progress)
    atexit.register(session.stop)  # the kernel's exit ends the ranks and frees the slots
    return session


def run_in_session(session, cell, *, view=None, background=False, options=None, **given):
    """Run a captured session cell (`hvd_magic.capture.session.SessionCell`) on the session's
    ranks; return the finished `Run`, as `run` does. `options` (`RunOptions`), or its fields as
    keyword arguments (`timeout`, `name`, `stall_timeout`, `on_stall`, `data`, `mlflow`...);
    `data` is for this cell (and the session's later cells, until another `data`)."""
    from .launch.session import SessionLauncher

    options = options if options is not None else RunOptions(**given)
    _, options = check_together(session.placement, options)
    pickled = pickle_values(dict(cell.values))
    job = {"code": cell.code, "assigns": list(cell.assigns), "sources": cell.sources,
           "export": list(cell.export),
           **_shipped(pickled.values(), cell.imports, marshal.loads(cell.code),
                      dict(cell.values))}
    refuse_without_horovod(_reading(job), job, session.placement, options)
    # (the session's ranks started without MLFLOW_* variables: only the driver logs)
    view, _ = tracked(options.mlflow, view, None, job, cell, options.tracked())
    run_ = Run(session.np, options, launcher=SessionLauncher(session), view=view, cell=cell,
               elastic=session.elastic)
    try:
        return run_.launch(job, pickled, background=background)
    finally:
        if run_.started is not None:  # the ranks ran it (or began to): what it bound is theirs
            session.remember(cell)
