"""``%horovod_debug``: drive the pdb of a warm session's rank held at its exception or at
``hvd_magic.breakpoint()``, from the notebook (`hvd_magic.driver.debugger`)."""

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..driver import history
from ..driver.debugger import console
from .options import summary_first


@summary_first
@magic_arguments()
@argument("--rank", type=int, default=None,
          help="Which held rank (default: the lowest).")
def horovod_debug(magics, line):
    """pdb on a held rank's live frames, a command a line: ``p loss``, ``pp batch``, ``up``,
    ``where``, any expression on the rank's values; ``c`` or ``q`` lets the rank go on (a
    rank held at its exception then ends the cell with its error). A rank is held at its
    exception in a session started with ``--debug``, or at ``hvd_magic.breakpoint()`` in a
    session cell. A foreground cell opens this itself; use it for a background cell.

    Examples
    --------
    ::

        %horovod_session start --np -2 --debug
        %%horovod --background
        ...                              # raises on rank 1
        %horovod_debug                   # (Pdb) p loss, up, where, c
    """
    args = parse_argstring(horovod_debug, line)
    runs = [r for r in history.runs() if r.state == "running" and r.held()]
    if not runs:
        raise UsageError("no rank is held in pdb: start the session with --debug "
                         "(%horovod_session start --debug) for a rank to stop at its exception, "
                         "or call hvd_magic.breakpoint() in a session cell.")
    run = runs[-1]
    if args.rank is not None and args.rank not in run.held():
        raise UsageError(f"rank {args.rank} is not held in pdb; held: "
                         f"{', '.join(map(str, sorted(run.held())))}.")
    console(run, args.rank)
