"""Lightning's metrics and progress on the dashboard: `MetricsLogger` and `ProgressCallback`.

On a rank, every ``Trainer`` gets both by itself (`hvd_magic.rank.trainers`), so a
LightningModule's ``self.log(...)`` values become the live charts' points (and, rank 0's,
MLflow's metrics) as Keras' do through `hvd_magic.keras.MetricsCallback`, and the fit's progress
is the rank's progress in the rank table. Nothing to add to the Trainer; the classes are public
for a Trainer made outside a rank (where they report nothing) or built by hand.

- `MetricsLogger` is a Lightning logger: Lightning hands it exactly what it hands TensorBoard,
  at the same steps (every ``log_every_n_steps`` training steps, each epoch's end, validation),
  and it ``report()``s that. Unlike Lightning's own loggers it reports on every rank, not rank 0
  only: the charts draw a line per rank. It writes no files, and it leaves the Trainer's folders
  as they were: alone, its ``save_dir`` is the Trainer's ``default_root_dir`` and its name and
  version are empty, so checkpoints still go to ``<default_root_dir>/checkpoints``; beside other
  loggers it comes last and takes the first one's version (the bar's ``v_num`` stays theirs).
  The ``epoch`` Lightning adds to every log is left out (charts are of what the module logged;
  the progress column says where the fit is), and at the fit's end (``finalize``) its last
  values are sent at once.
- `ProgressCallback` reports the optimizer steps done against the fit's total
  (``Trainer.estimated_stepping_batches``) before every training batch and at the end: one bar
  over the whole fit, at the steps the metrics are charted against. Lightning's own bar is left
  to print as it does; a tqdm bar of Lightning's does not also report (it counts per epoch).

Works with ``lightning.pytorch`` and the older ``pytorch_lightning`` package: the classes are
made for the package the Trainer comes from. Importing this module imports neither.
"""

import math
import sys

from .rank.reporting import flush, report

_classes = {}   # package name -> (MetricsLogger class, ProgressCallback class)


def _package():
    """The Lightning package in use: the one already imported, else ``lightning.pytorch``."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if name in sys.modules:
            return sys.modules[name]
    import lightning.pytorch
    return lightning.pytorch


def classes(pl):
    """`MetricsLogger` and `ProgressCallback` classes for the Lightning package `pl`."""
    if pl.__name__ not in _classes:
        _classes[pl.__name__] = _make(pl)
    return _classes[pl.__name__]


def _make(pl):
    class _MetricsLogger(pl.loggers.Logger):
        def __init__(self, save_dir=None, beside=()):
            super().__init__()
            self._save_dir = save_dir
            self._beside = list(beside)  # the Trainer's other loggers
            self.total = None            # the fit's steps, set by ProgressCallback
            self.trainer = None          # set by ProgressCallback: what the module logged

        @property
        def name(self):
            return ""

        @property
        def version(self):
            return self._beside[0].version if self._beside else ""

        @property
        def save_dir(self):
            return self._save_dir

        def log_hyperparams(self, params, *args, **kwargs):
            pass  # (MLflow gets the run's own parameters from hvd_magic)

        def log_metrics(self, metrics, step=None):
            values = dict(metrics)
            values.pop("step", None)  # a logged "step" is Lightning's name for `step` itself
            if "total" in values:     # (report's own argument)
                values["total (logged)"] = values.pop("total")
            # Lightning adds the epoch to what the module logged, "for convenience": charted, it
            # took half the charts of every fit. Kept only where the module logged it itself
            # (Lightning's `logged_metrics` has the module's values, without its addition).
            logged = getattr(self.trainer, "logged_metrics", {})
            if "epoch" in values and "epoch" not in logged:
                del values["epoch"]
            if values:
                report(step=step, total=self.total, **values)

        def finalize(self, status):
            flush()  # the fit's last values go now, not after the throttle's interval

    class _ProgressCallback(pl.callbacks.Callback):
        def setup(self, trainer, pl_module, stage):
            for logger in trainer.loggers:
                if isinstance(logger, _MetricsLogger):
                    logger.trainer = trainer

        def on_train_start(self, trainer, pl_module):
            total = trainer.estimated_stepping_batches
            self.total = int(total) if math.isfinite(total) else None
            for logger in trainer.loggers:
                if isinstance(logger, _MetricsLogger):
                    logger.total = self.total

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            report(step=trainer.global_step, total=self.total)

        def on_train_end(self, trainer, pl_module):
            report(step=trainer.global_step, total=self.total)
            flush()

    return _MetricsLogger, _ProgressCallback


def MetricsLogger(save_dir=None):
    """A Lightning logger that reports what the LightningModule logs (on a rank: to the live
    charts and MLflow; elsewhere: nowhere). A rank's Trainer has one already."""
    return classes(_package())[0](save_dir)


def ProgressCallback():
    """A Lightning callback that reports the fit's steps as the rank's progress. A rank's
    Trainer has one already."""
    return classes(_package())[1]()
