"""hvd_magic: run a notebook cell on N real Horovod ranks through a Spark barrier stage.

    %load_ext hvd_magic

    %%horovod --np 4
    import torch, horovod.torch as hvd
    hvd.init()
    hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()

Importing this package has no side effects and loads neither IPython nor Spark: rank processes
import it too, and must start as fresh interpreters. The API is loaded on first use.
"""

from .errors import (HorovodMagicError, InternalError, LaunchError, RankError, ResultError,
                     RunCancelled, RunStalled, RunTimeout)
from .rank.data import batch_count, numpy_batches, shard, tf_dataset, torch_batches
from .rank.reporting import report, tensorboard_dir

__version__ = "0.1.0"

_API = {"run", "last_run", "runs", "Run", "spark_session"}


def __getattr__(name):
    if name in _API:
        from . import api
        return getattr(api, name)
    if name == "run_script":
        from .frontends.script import run_script
        return run_script
    if name == "HorovodRunner":  # Databricks' sparkdl.HorovodRunner API
        from .frontends.horovod_runner import HorovodRunner
        return HorovodRunner
    if name in ("TorchDistributor", "DeepspeedTorchDistributor", "MirroredStrategyRunner"):  # pyspark's, spark-tensorflow-distributor's
        from .frontends import distributors
        return getattr(distributors, name)
    if name in ("sweep", "last_sweep"):  # several trials as gangs (hvd_magic.sweeps)
        from .sweeps import api as sweep_api
        return getattr(sweep_api, name)
    if name == "TrialStopped":  # a sweep's early stop, raised by report() on a rank
        from .rank.trial import TrialStopped
        return TrialStopped
    if name == "timeline":  # `with hvd_magic.timeline():` on a rank
        from .timelines.record import timeline
        return timeline
    if name == "elastic":  # `hvd_magic.elastic.TorchState` on a rank
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    if name == "breakpoint":  # a warm session's rank stopped in pdb, driven from the notebook
        from .rank.debugger import breakpoint
        return breakpoint
    raise AttributeError(f"module 'hvd_magic' has no attribute {name!r}")


def load_ipython_extension(ip):
    """`%load_ext hvd_magic`: register `%%horovod` and `%horovod_timeline`."""
    from .frontends import ended_runs, warmup
    from .frontends.magics import HorovodMagics
    magics = HorovodMagics(shell=ip)
    ip.register_magics(magics)
    # display(run), and a run left as a cell's value: its dashboard
    ip.display_formatter.ipython_display_formatter.for_type_by_name(
        "hvd_magic.driver.run", "Run", _show_run)
    for said in (ended_runs.said(magics.run_root), warmup.start(ip.user_ns, magics)):
        if said:  # (the runs the kernel before this one left; what starts in the background)
            _say(said)


def _say(text):
    """Print `text` wrapped: a notebook does not wrap printed text, a long line runs off its
    edge."""
    import textwrap

    print("\n".join(textwrap.fill(line, 96, subsequent_indent="  ")
                    for line in text.splitlines()))


def _show_run(run):
    from .view.run_display import show_run
    show_run(run)


def unload_ipython_extension(ip):
    """`%unload_ext hvd_magic` (and `%reload_ext`): a warm session's ranks end with it."""
    from .frontends.magics import HorovodMagics
    from .launch import prestart
    prestart.release("unloading hvd_magic")
    ip.display_formatter.ipython_display_formatter.pop("hvd_magic.driver.run.Run", None)
    for kind in ("line", "cell"):
        for name, fn in list(ip.magics_manager.magics[kind].items()):
            owner = getattr(fn, "__self__", None)
            if isinstance(owner, HorovodMagics):
                if owner.session is not None:
                    owner.session.stop()
                    owner.session = None
                del ip.magics_manager.magics[kind][name]


__all__ = ["shard", "batch_count", "torch_batches", "tf_dataset", "numpy_batches",
           "tensorboard_dir", "run", "run_script", "last_run", "runs", "Run", "spark_session",
           "sweep", "last_sweep", "HorovodRunner", "TorchDistributor",
           "DeepspeedTorchDistributor", "MirroredStrategyRunner", "report", "timeline",
           "breakpoint", "RankError", "ResultError", "LaunchError", "RunCancelled", "RunStalled",
           "RunTimeout", "TrialStopped", "InternalError", "HorovodMagicError"]
