"""The sweep's Python API, and the one the ``--sweep`` cell option calls: `sweep(fn, ...)`,
`sweep_cell(...)`, `last_sweep()`.

A trial is `hvd_magic.api.run` (or `run_cell`) in the background with the trial's values bound:
a function's as keyword arguments, a cell's as the free names it reads (the notebook's own
`lr`, if any, is what a single run uses; a trial's `lr` takes its place), under its own folder
inside the sweep's.

Not for: scheduling (`hvd_magic.sweeps.runner`) or showing (`hvd_magic.sweeps.view`).
"""

import dataclasses

from IPython.core.error import UsageError

from ..config import split
from .options import SweepOptions
from .runner import Sweep
from .slots import Slots, count_slots
from .tracking import sweep_tracking

_sweeps = []  # this kernel's sweeps, oldest first (`last_sweep`)


def last_sweep():
    """This kernel's latest sweep, or None."""
    return _sweeps[-1] if _sweeps else None


def _slots(placement, sweep_options):
    total, what, gpus = count_slots(placement)
    if sweep_options.slots is not None:
        total, gpus = sweep_options.slots, (gpus[:sweep_options.slots] if gpus else None)
    if placement.ranks > total:
        raise UsageError(f"a trial needs {placement.ranks} ranks and the sweep has "
                         f"{total} {what}: lower --np, or give more slots (slots=).")
    return Slots(total, what, gpus)


def sweep(fn, np=2, params=None, *, search="grid", trials_at_once=None, metric="loss",
          mode="min", early_stop=None, fail_fast=False, slots=None, seed=None, trials=None,
          kwargs=None, view=None, background=False, **run_options):
    """Run `fn(**values)` once per trial of `params` on `np` ranks, the trials as gangs sharing
    the slots; return the `Sweep` (finished, unless `background`).

    `params`: {name: [values]} (or the ``--sweep`` text); `search`: "grid" (every combination),
    "random:N", "optuna:N", or an Optuna study or sampler (`trials` of them: its pruner stops
    trials early); `trials_at_once`: at most this many together (None: what the slots hold);
    `metric`/`mode`: what ranks the trials (``hvd_magic.report(step=..., loss=...)`` on rank 0);
    `early_stop`: "median" or "asha" (every rank of a stopped trial leaves at the same step);
    `fail_fast`: a failing trial cancels the rest; `slots`: ranks that may run at once (default:
    the machine's cores or GPUs, or Spark's task slots). Every other keyword is `run`'s, for
    every trial.

    Examples
    --------
    >>> def train(lr, width):
    ...     for step in range(1, 11):
    ...         hvd_magic.report(step=step, loss=...)
    >>> s = hvd_magic.sweep(train, np=-2, params={"lr": [1e-3, 1e-2], "width": [64, 128]})
    >>> s.table()
    >>> s.best.rerun(np=-4)
    """
    if not callable(fn):
        raise UsageError(f"fn must be callable, not {type(fn).__name__}.")
    sweep_options = SweepOptions(params, search, trials_at_once, metric, mode, early_stop,
                                 fail_fast, slots, seed, trials)
    placement, options = split(np, **run_options)
    extra = dict(kwargs or {})
    from .. import api

    def launch(values, view=None, env=None, run_dir=None, np=None, rerun=False, **more):
        given = dict(run_options, **more)
        if env:
            given["env"] = {**(given.get("env") or {}), **env}
        if run_dir is not None:
            given["run_dir"] = run_dir
        return api.run(fn, np=placement.np if np is None else np, kwargs={**extra, **values},
                       view=view if not rerun else given.pop("view", None),
                       background=not rerun, **given)

    return start_sweep(launch, placement, options, sweep_options, view=view,
                       background=background)


def sweep_cell(capture, placement, options, sweep_options, *, view=None, background=False):
    """A ``%%horovod --sweep`` cell: `capture(values)` makes the trial's `CellFunction` (the
    cell captured with the trial's values over the notebook's)."""
    from .. import api

    def launch(values, view=None, env=None, run_dir=None, np=None, rerun=False, **more):
        place = placement if np is None else dataclasses.replace(placement, np=np)
        changed = dict(more)
        changed.pop("view", None)
        if env:
            changed["env"] = {**options.env, **env}
        if run_dir is not None:
            changed["run_dir"] = run_dir
        if not options.timeline:  # (its steps, normalised, would say --timeline once more)
            changed["timeline_steps"] = None
        return api.run_cell(capture(values), place, dataclasses.replace(options, **changed),
                            view=view if not rerun else more.get("view"),
                            background=not rerun)

    return start_sweep(launch, placement, options, sweep_options, view=view,
                       background=background)


def start_sweep(launch, placement, options, sweep_options, *, view=None, background=False):
    """Make the `Sweep`, start it, and (unless `background`) show it until it ends; an
    interrupt cancels it (every trial's ranks ended) and is raised again."""
    slots = _slots(placement, sweep_options)
    points, search = sweep_options.points(), sweep_options.searcher()
    tracking = sweep_tracking(options.mlflow, options.name)
    run = Sweep(launch, points, placement.ranks, slots,
                trials_at_once=sweep_options.trials_at_once, metric=sweep_options.metric,
                mode=sweep_options.mode, rule=sweep_options.rule,
                fail_fast=sweep_options.fail_fast, run_root=options.run_root,
                name=options.name, params=list(sweep_options.params), search=search,
                space=sweep_options.params, tracking=tracking)
    _sweeps.append(run)
    if view is not None:
        view.start(run)
    if background:  # the scheduler thread keeps the view up to date, and finishes it
        run.view = view
        return run.start()
    run.start()
    try:
        while not run.ended_within(0.2):
            if view is not None:
                view.tick(run)
    except KeyboardInterrupt:
        run.cancel()
        run.ended_within(60)
        raise
    finally:
        if view is not None and run.done:
            view.finish(run)
    return run.wait()
