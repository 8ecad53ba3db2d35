"""``%horovod_stacks``: every rank's Python stack, of the running run or the last one, grouped.

A thin shell over `Run.stacks()` (`hvd_magic.driver.stacks`): which run (a background one still
running, a warm session's, else the latest), and how to show it.
"""

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..driver import history
from .options import summary_first


def _pick(which):
    runs = history.runs()
    if which:
        found = [r for r in runs if r.id.endswith(which)]
        if not found:
            raise UsageError(f"no run of this kernel has an id ending in {which!r} "
                             f"(hvd_magic.runs() lists them).")
        return found[-1]
    running = [r for r in runs if r.state == "running"]
    if running:
        return running[-1]
    if not runs:
        raise UsageError("no run yet in this kernel: %horovod_stacks shows the stacks of a "
                         "running one (e.g. %%horovod --background, hvd_magic.run(..., "
                         "background=True)).")
    return runs[-1]


@summary_first
@magic_arguments()
@argument("run", nargs="?", default=None,
          help="The run: the end of its id (default: the running one, else the latest).")
@argument("--rank", type=int, default=None,
          help="One rank's whole stack, every thread and frame, instead of the grouped view.")
@argument("--timeout", type=float, default=2.0,
          help="Seconds to wait for the ranks' answers (default 2): a rank that has not "
               "answered by then is named, not waited on.")
def horovod_stacks(magics, line):
    """Every rank's Python stack now (all threads), grouped: ranks at the same place are one
    entry, headed by the innermost line of your own code and what it called; the frames of the
    frameworks and the standard library folded. A rank stuck in C code holding the GIL still
    answers (faulthandler: frames without locals). For a run that ended: the stacks kept when it
    was cancelled, timed out or stalled (also in its folder's stacks.txt).

    Examples
    --------
    ::

        %horovod_stacks               # the running run (a background one, a warm session's)
        %horovod_stacks --rank 3      # rank 3's whole stack
        stacks = %horovod_stacks      # a mapping rank -> stack text
    """
    args = parse_argstring(horovod_stacks, line)
    run = _pick(args.run)
    try:
        stacks = run.stacks(timeout=args.timeout)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    if args.rank is not None:
        if args.rank not in stacks:
            why = stacks.missing.get(args.rank, f"no rank {args.rank} in a run of {run.np}")
            raise UsageError(f"rank {args.rank}: no stack ({why}).")
        print(stacks[args.rank])
        return None
    return stacks
