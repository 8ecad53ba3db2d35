"""`HorovodRunner`: the API of Databricks' ``sparkdl.HorovodRunner``, on hvd_magic's launcher.

Code written for Databricks runs as it is::

    from hvd_magic import HorovodRunner
    result = HorovodRunner(np=2).run(train, epochs=5)

and gets what `%%horovod` gives: the live view (dashboard in a notebook, ``[rank k]`` lines in a
script), a log per rank in the run folder, the whole run stopped as soon as one rank fails, with
that rank's own traceback, timeouts, the hang watchdog, timelines. A thin shell over
`hvd_magic.api.run`; what it adds is checking the call before anything starts: `np`, the function,
the keyword arguments against its signature, and every global it reads that cannot be pickled,
each named.

Not for: options of the run itself in `run()`: as in sparkdl, `run`'s keyword arguments all go to
the function, so the run's options go to the constructor.
"""

import inspect
import sys
import types

from IPython.core.error import UsageError

from .. import api
from ..capture import pickle_values
from ..timelines.show import TimelineNote
from ..view import Opening, TextView, make_view

__all__ = ["HorovodRunner"]

VERBOSITIES = ("log_callback_only", "all")
# The run options the constructor takes besides np and driver_log_verbosity.
OPTIONS = ("timeout", "timeline", "env", "stall_timeout", "on_stall", "text", "quiet",
           "spark", "master", "spark_conf", "run_dir", "name", "retries", "horovod_env",
           "tensorboard")


class HorovodRunner:
    """Run a function on `np` Horovod ranks, as Databricks' ``sparkdl.HorovodRunner`` does.

    Parameters
    ----------
    np : int
        N > 0: N ranks as one Spark barrier stage on the executors (the active SparkSession, or an
        embedded ``local[N]`` one); more ranks than the cluster has task slots is refused before
        anything starts. -N: N ranks as processes of the driver, without Spark (for trying
        things out). 0 is an error.
    driver_log_verbosity : "log_callback_only" (default) or "all"
        What the text view (scripts, ``text=True``) streams: ``"all"`` every rank's output;
        ``"log_callback_only"`` rank 0's only (where Keras' ``verbose=1 if hvd.rank() == 0``
        prints), as sparkdl streams only what is logged to the driver. Either way every rank's
        full log is in the run folder (``hvd_runs/<run id>/rank-<k>.log``) and a failing rank's
        traceback is raised; the notebook dashboard shows every rank in its own row.
    timeout : float, optional
        Stop every rank after this many seconds (``RunTimeout``).
    timeline : bool
        Record a Horovod timeline on rank 0, brought back as ``timeline.json`` in the run folder.
    tensorboard : str, optional
        Where each rank's TensorBoard logs (written to ``hvd_magic.tensorboard_dir()`` on the
        rank) come back, as ``rank-<k>/`` (default: ``tensorboard/`` in the run folder).
    env : dict, optional
        Environment variables for every rank. Ranks get ``TF_USE_LEGACY_KERAS=1`` (Keras 2 for
        ``import keras`` and ``tf.keras``) and ``TF_CPP_MIN_LOG_LEVEL=2`` unless this says otherwise.
    stall_timeout : float
        Seconds some ranks may wait in a collective the others never call before the watchdog
        reports it, with each waiting rank's stack (default 60).
    on_stall : "warn" or "fail"
        What a stall does: report and keep waiting, or stop the run.
    text : bool
        Plain text output even where widgets work.
    quiet : bool
        Show nothing but errors; the logs are still written.
    spark, master, spark_conf
        The SparkSession to use, or the master URL and settings of one hvd_magic starts.
    run_dir, name, retries, horovod_env
        As in `hvd_magic.run`: the run's folder, a label, Spark stage re-attempts allowed
        (default 0: a retried stage is reported, never silently restarted), HOROVOD_* settings.

    Examples
    --------
    ::

        def train(epochs=3):
            import keras
            import horovod.keras as hvd
            hvd.init()
            ...
            return model.evaluate(x_test, y_test)

        HorovodRunner(np=2).run(train, epochs=5)          # on 2 Spark tasks; rank 0's value
        HorovodRunner(np=-2).run(train)                    # 2 processes on the driver
        HorovodRunner(np=4, driver_log_verbosity="all", timeout=3600, timeline=True).run(train)
    """

    def __init__(self, np, driver_log_verbosity="log_callback_only", **options):
        self.num_processor = api.check_np(np)  # sparkdl's attribute name
        if driver_log_verbosity not in VERBOSITIES:
            raise UsageError(f"driver_log_verbosity must be one of {', '.join(map(repr, VERBOSITIES))}, "
                             f"not {driver_log_verbosity!r}.")
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise UsageError(f"HorovodRunner() got unknown option(s) {', '.join(unknown)}; it takes "
                             f"np, driver_log_verbosity and {', '.join(OPTIONS)}. Arguments for the "
                             f"function go to .run(main, **kwargs).")
        self.driver_log_verbosity = driver_log_verbosity
        self.options = options

    def run(self, main, **kwargs):
        """Run ``main(**kwargs)`` on every rank; return rank 0's return value.

        Raises `hvd_magic.RankError` with the failing rank's own traceback if any rank fails,
        and `UsageError`, before anything starts, for a call that cannot work. Every rank's value
        is in ``hvd_magic.last_run().results``.
        """
        check_call(main, kwargs)
        return shown(self.num_processor, self.options,
                     lambda **options: api.run(main, self.num_processor, kwargs=kwargs, **options),
                     rank_zero_lines=self.driver_log_verbosity == "log_callback_only").value


def shown(np, options, start, rank_zero_lines=False):
    """`start(view=..., **options)`'s run, shown as a runner shows it: the dashboard in a notebook
    (opened at once), else text (only rank 0's lines with `rank_zero_lines`); `options`: a
    runner's, with ``text`` and ``quiet``."""
    options = dict(options)
    text, quiet = options.pop("text", False), options.pop("quiet", False)
    opening = None if quiet or text else Opening.show(np)
    try:
        view = make_view(quiet=quiet, widgets=False if text else None, opening=opening)
        if isinstance(view, TextView):  # the dashboard shows every rank's log in its own row
            if rank_zero_lines:
                view = RankZeroLines(view)
            view = TimelineNote(view)
        return start(view=view, **options)
    finally:
        if opening is not None:
            opening.clear()


def check_call(main, kwargs, args=(), who="HorovodRunner.run"):
    """UsageError unless `main(*args, **kwargs)` can be sent to the ranks and called there."""
    if not callable(main):
        raise UsageError(f"{who} takes the function to run on every rank, not "
                         f"{type(main).__name__}: pass it uncalled, run(train), not run(train()).")
    name = getattr(main, "__name__", type(main).__name__)
    try:
        signature = inspect.signature(main)
    except (TypeError, ValueError):  # some builtins and C callables have none: let the call tell
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            given = ([f"{len(args)} positional argument{'s' * (len(args) != 1)}"] if args else []) + \
                ([f"the keyword arguments {', '.join(kwargs)}"] if kwargs else [])
            call = "main(*args, **kwargs)" if args else "main(**kwargs)"
            raise UsageError(f"{name}{signature} cannot be called with "
                             f"{' and '.join(given) or 'no arguments'}: {exc}. {who}(main, ...) "
                             f"calls {call} on every rank; pass the arguments it takes.") from None
    pickle_values(globals_read(main), inside=f"{name}()")


def globals_read(fn):
    """The globals and closure values `fn` reads that cloudpickle would send by value.

    cloudpickle pickles a function of ``__main__`` (a notebook, a script) together with the
    globals it reads, so one global that cannot be pickled fails the whole function, and the
    error names the function, not the global. Pickled on its own, each global is named.
    Modules travel by name (re-imported on the rank), so they are left out; so are functions of
    importable modules, which cloudpickle sends by reference, globals and all.
    """
    if not isinstance(fn, types.FunctionType):
        return {}
    module = getattr(fn, "__module__", None)
    if module != "__main__" and module in sys.modules and "<locals>" not in fn.__qualname__:
        return {}
    found, seen = {}, set()
    _collect(fn, found, seen)
    return found


def _collect(fn, found, seen):
    if fn in seen:
        return
    seen.add(fn)
    names = set()
    for code in _codes(fn.__code__):
        names.update(code.co_names)
    values = {n: fn.__globals__[n] for n in names if n in fn.__globals__}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # an empty cell: a name assigned after the function was made
            pass
    for name, value in values.items():
        if isinstance(value, types.ModuleType):
            continue
        if isinstance(value, types.FunctionType) and value.__module__ == fn.__module__:
            _collect(value, found, seen)  # a helper of the same notebook: its globals travel too
            continue
        found.setdefault(name, value)


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions, lambdas, comprehensions
            yield from _codes(const)


class RankZeroLines:
    """A text view that streams only rank 0's output (``driver_log_verbosity="log_callback_only"``)."""

    def __init__(self, view):
        self.view = view

    def __getattr__(self, name):
        return getattr(self.view, name)

    def event(self, run, rank, event):
        if event.get("t") == "lines" and rank not in (0, None):
            return
        self.view.event(run, rank, event)
