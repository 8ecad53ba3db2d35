"""``%%horovod`` cells: parsed options in, the cell's value out; run once on fresh ranks, or in
the warm session when one is active (`hvd_magic.driver.session`)."""

import sys

from IPython.core.error import UsageError

from .. import api
from ..compat import ipython as ipython_compat
from ..capture import capture_cell
from ..capture.session import capture_session_cell
from ..config import Placement, RunOptions, check_together, is_dataframe
from ..errors import cell_filename
from .options import elastic_kwargs, env_option, names
from .sweep_magic import run_sweep_cell, sweep_options
from ..timelines.show import TimelineNote
from ..view import TextView, make_view


def run_cell(magics, args, cell, opening=None):
    """Run a ``%%horovod`` cell whose options are `args`; return what the cell shows.
    `opening` (`hvd_magic.view.Opening`) is what the cell shows already."""
    session = magics._active_session()
    if session is not None:
        return run_in_session(magics, session, args, cell, opening)
    export = names(args.export)
    shell = magics.shell
    data = data_option(shell.user_ns, args.data)
    placement, options, view = run_options(magics, args, data, opening)
    chosen = sweep_options(args)
    if chosen is not None:  # one cell, many trials (hvd_magic.sweep)
        sweep = run_sweep_cell(magics, args, cell, chosen, placement, options,
                               where_in_notebook(shell))
        return sweep if args.background else None
    cell_fn = capture_cell(cell, shell.user_ns, export=export, hidden=set(shell.user_ns_hidden),
                           **where_in_notebook(shell))
    run = api.run_cell(cell_fn, placement, options, view=view, background=args.background)
    if args.background:
        return run
    if run.exports:
        shell.user_ns.update(run.exports)
    return None if cell_fn.quiet else run.value


def where_in_notebook(shell):
    """The cell's prompt number and the editor's number of the line after ``%%horovod``, for
    tracebacks that say ``Cell In[5], line 6`` as IPython's own do. IPython 9 counts the next
    cell up before running this one: the running cell's number is its result's."""
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(running, "execution_count", None)
    if count is None:  # run_cell_magic called outside a cell (a test, a script)
        count = shell.execution_count
    ipython_compat.name_cell_file(shell, cell_filename(count), count)  # a SyntaxError's Cell In[N]
    return {"cell_id": count, "first_line": 2}


def run_options(magics, args, data, opening=None):
    """(`Placement`, `RunOptions`, view) from a ``%horovod`` line's options (a cell's or a
    script's) and the magics' defaults, checked together (`hvd_magic.config`); `opening` is
    what the cell shows already."""
    verbose = args.verbose or magics.verbose
    placement = Placement(
        magics.np if args.np is None else args.np, master=args.master,
        spark_conf=magics.spark_conf, log_dir=magics.run_root, verbose=verbose,
        **elastic_kwargs(args))
    options = cell_options(magics, args, data, env=env_option(args.env),
                           horovod_env=magics.horovod_settings, retries=args.retries,
                           timeline=args.timeline, timeline_steps=args.timeline_steps,
                           timeline_detail=args.timeline_detail,
                           tensorboard=args.tensorboard, ship=args.ship)
    view = make_view(quiet=args.quiet, widgets=False if args.text else None, verbose=verbose,
                     opening=opening)
    if isinstance(view, TextView):  # the dashboard shows the timeline itself
        view = TimelineNote(view)
    return (*check_together(placement, options), view)


def cell_options(magics, args, data, **more):
    """The `RunOptions` a cell's line gives, fresh ranks or a session's (`more`: the fields
    only fresh ranks take)."""
    return RunOptions(
        timeout=args.timeout if args.timeout is not None else magics.timeout,
        stall_timeout=args.stall_timeout or magics.stall_timeout, on_stall=args.on_stall,
        name=args.name, broadcast_bytes=int(magics.broadcast_mb * 1024 * 1024),
        data=data, equal_shards=args.equal_shards, data_cache=magics.data_cache or None,
        mlflow=args.mlflow, run_root=magics.run_root,
        fresh=args.fresh if args.fresh is not None else magics.fresh, **more)


def data_option(user_ns, name):
    """The DataFrame that ``--data NAME`` names, or None."""
    if name is None:
        return None
    if name not in user_ns:
        raise UsageError(f"--data {name}: the notebook has no variable {name!r}. Name a Spark "
                         "DataFrame, e.g. df = spark.read.parquet(...), then --data df.")
    value = user_ns[name]
    if not is_dataframe(value):
        raise UsageError(f"--data {name}: {name} is a {type(value).__name__}, not a Spark "
                         "DataFrame. For pandas or numpy data, name the variable in the cell "
                         "instead (it is sent to every rank); for files, spark.read them first.")
    return value


def run_in_session(magics, session, args, cell, opening=None):
    data = data_option(magics.shell.user_ns, args.data)
    placement = [flag for flag, given in (("--np", args.np is not None),
                                          ("--master", args.master), ("--env", args.env),
                                          ("--retries", args.retries),
                                          ("--timeline", args.timeline),
                                          ("--timeline-steps", args.timeline_steps),
                                          ("--timeline-detail", args.timeline_detail),
                                          ("--tensorboard", args.tensorboard),
                                          ("--min-np", args.min_np is not None),
                                          ("--sweep", args.sweep)) if given]
    if placement:
        raise UsageError(
            f"{' and '.join(placement)} cannot change where a cell runs while session "
            f"{session.id} is active ({session.np} ranks on {session.where}): drop "
            f"{'them' if len(placement) > 1 else 'it'}, or end the session first with "
            f"%horovod_session stop. (Inside a session cell, `with hvd_magic.timeline():` "
            f"records a timeline.)")
    shell = magics.shell
    cell_fn = capture_session_cell(cell, shell.user_ns, **where_in_notebook(shell),
                                   export=names(args.export),
                                   hidden=set(shell.user_ns_hidden),
                                   functions=session.functions, assigned=session.assigned)
    options = cell_options(magics, args, data)
    view = make_view(quiet=args.quiet, widgets=False if args.text else None,
                     verbose=args.verbose or magics.verbose, opening=opening)
    try:
        run = api.run_in_session(session, cell_fn, view=view, background=args.background,
                                 options=options)
    finally:
        if session.broken and not session.stopped:  # said once, under the cell that broke it
            print(f"[hvd_magic] session {session.id} needs a restart: {session.broken}. "
                  f"Run %horovod_session restart.", file=sys.stderr)
    if args.background:
        return run
    if run.exports:
        shell.user_ns.update(run.exports)
    return None if cell_fn.quiet else run.value
