"""Training scripts on N ranks: ``hvd_magic.run_script("train.py", args=[...], np=4)`` and the
line magic ``%horovod --np 4 train.py --epochs 3``.

A script is run as horovodrun runs ``python train.py args``: each rank executes the file as
``__main__`` (`hvd_magic.rank.script`), with its arguments in ``sys.argv``. The script's text and
the modules beside it that it imports travel with the job, so executors that do not see this
machine's files run it too. Everything after launching (dashboard, logs, the failing rank's own
traceback, timeline) is a run's like any cell's: `hvd_magic.api.launch`.

Not for: parsing a cell (`hvd_magic.frontends.cells`) or the terminal's options (`hvd_magic.frontends.terminal`).
"""

import os
import pickle
import shlex

from IPython.core.error import UsageError

from .. import api
from ..capture.modules import script_modules
from ..config import split
from ..payload import cloud_dumps


def script_job(path, args=()):
    """The job that runs the script at `path` with `args` on every rank: (job, its source)."""
    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(f"run_script takes the path of a Python file, not {type(path).__name__}.")
    path = os.fspath(path)
    if not os.path.isfile(path):
        where = "" if os.path.isabs(path) else f" in {os.getcwd()}"
        raise UsageError(f"No script {path!r}{where}. Give the path of a Python file (relative "
                         "to the notebook's folder, or absolute).")
    args = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
    with open(path, encoding="utf-8") as f:
        source = f.read()
    filename = os.path.abspath(path)
    compile(source, filename, "exec")  # a SyntaxError names the script's line, here and now
    from ..rank.script import run_script as on_rank  # pickled by reference: ranks import it

    job = {"fn": cloud_dumps(on_rank),
           "args": [pickle.dumps(x) for x in (path, source, args)],
           "sources": {filename: source},   # for the ranks' tracebacks (linecache)
           "modules": script_modules(path, source),
           "script": [path, *args]}
    return job, source


def run_script(path, args=(), np=2, **options):
    """Run the Python script at `path` on `np` Horovod ranks, as ``horovodrun -np N python
    path args`` would; return the finished `Run` (its `results` are None on every rank).

    Each rank runs the file as ``__main__`` with ``sys.argv = [path, *args]``; the modules beside
    it that it imports go with it. ``sys.exit(0)`` (or none) on every rank is success; a rank's
    non-zero exit is its failure (`RankError`, with the code). `np` and every other option are
    `hvd_magic.run`'s (`timeout`, `env`, `timeline`, `data`, `view`, `mlflow`...).

    Examples
    --------
    >>> run = hvd_magic.run_script("train.py", args=["--epochs", "3"], np=2)
    >>> run.state
    'done'
    """
    view, background = options.pop("view", None), options.pop("background", False)
    placement, run_options = split(np, **options)
    job, _ = script_job(path, args)
    return api.launch(job, {}, placement, run_options, view=view, background=background)


def script_line(magics, args, opening=None):
    """``%horovod [options] script.py [args]``: the line magic's options `args` to a run."""
    from .cells import data_option, run_options

    session = magics._active_session()
    if session is not None:
        raise UsageError(
            f"%horovod {args.command[0]} starts fresh ranks for the script, and warm session "
            f"{session.id} holds the slots ({session.np} ranks on {session.where}). End it first "
            f"with %horovod_session stop, or run the script's code in a %%horovod cell.")
    if args.export:
        raise UsageError("--export sets notebook names from a cell's variables; a script's stay on "
                         "its ranks. Have rank 0 write what you need (a checkpoint) to a file.")
    data = data_option(magics.shell.user_ns, args.data)
    placement, options, view = run_options(magics, args, data, opening)
    job, _ = script_job(args.command[0], args.command[1:])
    run = api.launch(job, {}, placement, options, view=view, background=args.background)
    return run if args.background else None
