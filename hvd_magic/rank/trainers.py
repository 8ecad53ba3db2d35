"""Lightning's Trainer and accelerate's Accelerator on a rank: they see the launched world,
never start processes of their own, and Lightning's metrics and progress reach the dashboard.

The ranks carry torchrun's environment (`hvd_magic.frameworks.torch`), ``TORCHELASTIC_RUN_ID``
included, so Lightning picks its ``TorchElasticEnvironment`` and ``strategy="ddp"`` runs in the
rank's own process, as under torchrun. What is hooked here, once the cell imports the library
(`hooks.when_imported`; a cell that does not pays nothing):

- Lightning (``lightning.pytorch`` or ``pytorch_lightning``): every ``Trainer`` is checked as it
  is made. A strategy that starts processes (``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``) would
  start them inside every rank; ``devices × num_nodes`` other than the world size fails at fit
  deep in Lightning, or (``devices=1``, the default on CPU) trains each rank alone without a word.
  Both raise one ``ValueError`` at the ``Trainer(...)`` line saying what to write instead. Then
  the Trainer gets `hvd_magic.lightning`'s logger and progress callback. Lightning's tqdm bar, if
  used, stops reporting progress itself: it counts per epoch, the callback over the whole fit.
- accelerate: ``Accelerator()`` on a rank without a CUDA device sees one process unless told the
  run is on CPU (``accelerate launch --cpu`` sets ``ACCELERATE_USE_CPU``; under plain torchrun one
  writes ``Accelerator(cpu=True)``). Such a rank gets ``ACCELERATE_USE_CPU=true``, unless the cell
  set it already; a rank with a GPU is left to pick it.

- TensorBoard (Lightning's default logger on rank 0, torch's ``SummaryWriter``) imports
  TensorFlow where it is installed, ~500 MB on that rank for nothing: a job that does not import
  TensorFlow or Keras itself has TensorBoard use its own stub (`tensorboard_without_tensorflow`:
  TensorBoard's ``tensorboard.compat.notf`` switch), as where TensorFlow is not installed.

Not for: the driver, or making any framework's environment (that is `hvd_magic.frameworks`).
"""

import functools
import os
from importlib import import_module

from . import hooks

TENSORFLOW_NAMES = ("tensorflow", "keras", "tf_keras")  # a job importing one keeps TensorBoard's TF
SPAWNING = ("spawn", "fork", "notebook")  # in the names of Lightning's strategies that start processes


def _world():
    env = os.environ
    return (int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_WORLD_SIZE", 1)),
            int(env.get("GROUP_WORLD_SIZE", 1)))


def instead(what):
    """`what` is wrong with the Trainer: the message, with the Trainer this world needs."""
    world, local, hosts = _world()
    if local * hosts != world:
        return (f"{what}; Lightning needs as many processes on every host (devices × num_nodes "
                f"= the world size), and this cell's {world} ranks are spread unevenly over "
                f"{hosts} hosts: ask for a number of ranks that fills each host alike")
    return (f"{what}; on hvd_magic's ranks write strategy='ddp', devices={local}, "
            f"num_nodes={hosts} (this cell's {world} ranks are Lightning's processes: {local} "
            f"on each of {hosts} host{'s' if hosts != 1 else ''})")


def problem(trainer, strategy):
    """What is wrong with `trainer` (made with `strategy`, as written) in this world, or None."""
    launcher = type(getattr(trainer.strategy, "launcher", None)).__name__
    if launcher == "_MultiProcessingLauncher":  # spawn, fork, forkserver
        named = f"strategy={strategy!r}" if isinstance(strategy, str) \
            else f"the strategy {type(trainer.strategy).__name__}"
        return instead(f"{named} starts processes of its own")
    world = _world()[0]
    devices, nodes = trainer.num_devices, trainer.num_nodes
    if devices * nodes != world:
        return instead(f"devices={devices} and num_nodes={nodes} make {devices * nodes} "
                       f"process{'es' if devices * nodes != 1 else ''}, but this cell runs on "
                       f"{world} ranks")
    return None


def _with_reporting(trainer, pl):
    from ..lightning import classes

    logger_class, callback_class = classes(pl)
    if not any(isinstance(logger, logger_class) for logger in trainer.loggers):
        beside = list(trainer.loggers)
        trainer.loggers = beside + [logger_class(trainer.default_root_dir, beside)]
    if not any(isinstance(callback, callback_class) for callback in trainer.callbacks):
        trainer.callbacks.insert(0, callback_class())  # (Lightning keeps checkpointing last)


def _patch_lightning(pl):
    cls = pl.Trainer
    if getattr(cls, "_hvd_magic_patched", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        strategy = kwargs.get("strategy")
        if isinstance(strategy, str) and any(word in strategy for word in SPAWNING):
            raise ValueError(instead(f"strategy={strategy!r} starts processes of its own"))
        original(self, *args, **kwargs)
        wrong = problem(self, strategy)
        if wrong:  # raised here: the cell's traceback ends one frame below its Trainer(...) line
            raise ValueError(wrong)
        _with_reporting(self, pl)

    cls.__init__ = __init__
    cls._hvd_magic_patched = True
    try:  # Lightning's tqdm bar counts per epoch: the progress callback reports instead
        import_module(f"{pl.__name__}.callbacks.progress.tqdm_progress").Tqdm._hvd_magic_quiet = True
    except (ImportError, AttributeError):
        pass


def tensorboard_without_tensorflow(imports):
    """Have TensorBoard use its stub, not TensorFlow, unless the job `imports` (module names)
    TensorFlow or Keras itself. True where it was done."""
    import sys
    import types
    if any(name.split(".")[0] in TENSORFLOW_NAMES for name in imports) \
            or "tensorflow" in sys.modules:
        return False
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    return True


def _cpu_if_no_gpu(accelerate):
    import torch
    if "ACCELERATE_USE_CPU" not in os.environ and not torch.cuda.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "true"


def install():
    """Hook Lightning and accelerate in this rank, for when the cell imports them."""
    hooks.when_imported("lightning.pytorch", _patch_lightning)
    hooks.when_imported("pytorch_lightning", _patch_lightning)
    hooks.when_imported("accelerate", _cpu_if_no_gpu)
