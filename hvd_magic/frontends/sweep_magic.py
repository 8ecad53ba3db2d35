"""``%%horovod --sweep "lr=1e-3,1e-2; width=64,128"``: the cell run once per trial, the trials
as gangs sharing the slots (`hvd_magic.sweep`), shown in one sweep view.

The options are declared here (added to ``%%horovod`` by `sweep_arguments`)
and read into a `hvd_magic.sweeps.options.SweepOptions`; each trial's cell is captured with the
trial's values over the notebook's namespace, so the cell reads ``lr`` as a variable.

Not for: running or showing the sweep (`hvd_magic.sweep`).
"""

from IPython.core.error import UsageError

def sweep_arguments(magic):
    """``%%horovod``'s sweep options (``--sweep``, ``--search``, ``--trials-at-once``,
    ``--metric``, ``--early-stop``, ``--fail-fast``), in this order in its help."""
    from IPython.core.magic_arguments import argument

    for flags, spec in reversed([
        ("--sweep", dict(type=str, metavar='"NAME=V1,V2; ..."', help=(
            "Run the cell once per trial of a grid, e.g. --sweep \"lr=1e-3,1e-2; "
            "width=64,128\" (4 trials): the cell reads lr and width as variables, the same "
            "on every rank of a trial. As many trials run at once as the slots hold (the "
            "machine's cores or GPUs, Spark's task slots), each with all of its ranks; the "
            "others wait. The sweep's view compares them; hvd_magic.last_sweep() is the "
            "Sweep (table(), best, best.rerun(np=...))."))),
        ("--search", dict(type=str, default="grid", metavar="grid|random:N|optuna:N", help=(
            "With --sweep: every combination (grid, the default), N random ones, or N asked "
            "of an Optuna study made in the notebook (the ranks never import Optuna)."))),
        ("--trials-at-once", dict(type=int, metavar="K", help=(
            "With --sweep: at most K trials run together (default: as many as the slots "
            "hold)."))),
        ("--metric", dict(type=str, default="loss", metavar="NAME", help=(
            "With --sweep: the metric the trials are ranked by, as rank 0 reports it with "
            "hvd_magic.report(step=..., NAME=...) (default loss; max:NAME when larger is "
            "better, e.g. max:accuracy)."))),
        ("--early-stop", dict(type=str, metavar="median|asha[:G]", help=(
            "With --sweep: stop a trial early when its metric falls behind (median: worse "
            "than the other trials' median at the same step; asha: successive halving), "
            "after G steps (default 1). Every rank of a stopped trial leaves at the same "
            "step (its hvd_magic.report(step=...) call)."))),
        ("--fail-fast", dict(action="store_true", help=(
            "With --sweep: a failing trial cancels the sweep (default: it is a row with its "
            "error and the others go on)."))),
    ]):
        magic = argument(flags, **spec)(magic)
    return magic


def sweep_options(args):
    """The `SweepOptions` of a ``%%horovod`` line, or None without ``--sweep``."""
    from ..sweeps.options import SweepOptions

    if args.sweep is None:
        used = [flag for flag, given in (("--trials-at-once", args.trials_at_once is not None),
                                         ("--early-stop", args.early_stop),
                                         ("--fail-fast", args.fail_fast),
                                         ("--search", args.search != "grid")) if given]
        if used:
            raise UsageError(f"{', '.join(used)} belong{'s' if len(used) == 1 else ''} to a "
                             f"sweep: add --sweep \"lr=1e-3,1e-2\" (the values to try).")
        return None
    mode, _, metric = args.metric.rpartition(":")
    return SweepOptions(params=args.sweep, search=args.search,
                        trials_at_once=args.trials_at_once, metric=metric,
                        mode={"": "min", "min": "min", "max": "max"}.get(mode, mode),
                        early_stop=args.early_stop, fail_fast=args.fail_fast)


def run_sweep_cell(magics, args, cell, chosen, placement, options, where):
    """Run a ``--sweep`` cell (`where`: its prompt number and first line); the `Sweep` (a
    background one at once)."""
    from ..capture import capture_cell
    from ..sweeps.api import sweep_cell
    from ..sweeps.view import make_sweep_view
    from .options import names

    if args.export:
        raise UsageError("--export sets names from one run; a sweep has many. Read "
                         "hvd_magic.last_sweep().best.run.exports, or rerun the best trial "
                         "with .best.rerun(np=...).")
    shell = magics.shell
    hidden = set(shell.user_ns_hidden)
    missing = [n for n in chosen.params if n not in _names_read(cell, shell, hidden)]
    if missing:
        raise UsageError(f"--sweep: the cell never reads {', '.join(missing)}: each trial "
                         f"gives the cell its values as variables; use them in the cell "
                         f"(e.g. optimizer = SGD(params, lr=lr)).")

    def capture(values):
        return capture_cell(cell, {**shell.user_ns, **values}, export=names(args.export),
                            hidden=hidden, **where)

    view = make_sweep_view(widgets=False if args.text else None, quiet=args.quiet,
                           background=args.background)
    return sweep_cell(capture, placement, options, chosen, view=view,
                      background=args.background)


def _names_read(cell, shell, hidden):
    from ..capture.cell import prepare
    from ..capture.names import names_read
    _, _, tree, _, _ = prepare(cell, {}, hidden=hidden)
    return names_read(tree)
