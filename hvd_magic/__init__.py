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
                     RunCancelled, RunTimeout)
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
    from .frontends.magics import HorovodMagics
    from .launch import prestart
    magics = HorovodMagics(shell=ip)
    ip.register_magics(magics)
    from .frontends import warmup
    held = warmup.to_hold(ip.user_ns)  # what the ranks' templates import from the start
    said = prestart.begin(ip.user_ns, magics.np, magics.spark_conf, magics.run_root, held)
    if said:
        print(said)
    warmup.begin(held)  # the --np -N ranks' template


def unload_ipython_extension(ip):
    """`%unload_ext hvd_magic` (and `%reload_ext`): a warm session's ranks end with it."""
    from .frontends.magics import HorovodMagics
    from .launch import prestart
    prestart.release("unloading hvd_magic")
    for kind in ("line", "cell"):
        for name, fn in list(ip.magics_manager.magics[kind].items()):
            owner = getattr(fn, "__self__", None)
            if isinstance(owner, HorovodMagics):
                if owner.session is not None:
                    owner.session.stop()
                    owner.session = None
                del ip.magics_manager.magics[kind][name]


__all__ = ["shard", "batch_count", "torch_batches", "tf_dataset", "numpy_batches", "tensorboard_dir", "run", "run_script", "last_run", "runs", "Run", "spark_session", "HorovodRunner", "TorchDistributor", "DeepspeedTorchDistributor", "MirroredStrategyRunner", "report", "timeline", "breakpoint", "RankError", "ResultError",
           "LaunchError", "RunCancelled", "RunTimeout", "InternalError", "HorovodMagicError"]
