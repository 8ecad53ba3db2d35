"""``%horovod_timeline``: a run's timeline drawn, summed up, listed, or its file's path.

A thin shell: its options and help; which run, and how each kind of timeline (Horovod's, or every
rank's torch profile) is shown, is `hvd_magic.timelines.show`.
"""

from IPython.core.magic_arguments import argument, magic_arguments

from .options import summary_first


@summary_first
@magic_arguments()
@argument("run", nargs="?", default=None,
          help="The run: its id, or the end of it (default: the latest run with a timeline, "
               "of this kernel or in hvd_runs/).")
@argument("--list", action="store_true",
          help="List the runs that have a timeline: id, start time, np, state, file size.")
@argument("--path", action="store_true",
          help="Return the path of the run's timeline file (to open or copy it).")
@argument("--summary", action="store_true",
          help="Tables of the top tensors and operations: count, total and mean time, "
               "bytes, share of wall time (a torch run's: each step's time on each rank, "
               "inside collectives and waiting there).")
@argument("--top", type=int, default=None,
          help="Rows per --summary table (default 10); lanes of the picture (default 16).")
def horovod_timeline(magics, line):
    """Draw the Horovod timeline of a run, a lane per tensor, with a link to its file.

    Example (two cells)::

        %%horovod --np 2 --timeline
        import torch, horovod.torch as hvd
        hvd.init()
        for step in range(20):
            hvd.allreduce(torch.ones(1000), name="grad")

        %horovod_timeline

    Rank 0's timeline comes back to the run folder as hvd_runs/<run id>/timeline.json when
    the run ends (also when it failed or was cancelled), if the run recorded one: with
    ``%%horovod --timeline`` (the whole run), or ``with hvd_magic.timeline():`` around a few
    steps inside the cell. The picture has a lane per tensor and Horovod's phases
    (NEGOTIATE_ALLREDUCE, QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE...) as coloured spans;
    Perfetto (ui.perfetto.dev) opens the file itself, offline too once it was opened
    online (it caches itself); ``--summary`` says which rank the others waited on.

    With torch and no Horovod (DDP, FSDP, Lightning, accelerate...), ``--timeline`` profiles
    every rank over optimizer steps 4 to 8 (``--timeline-steps``), merged with the clocks
    aligned into timeline-ranks.json.gz: a lane per rank (steps, collectives, waiting), a
    table per step and rank (``--summary``), the rank the others waited on named.

    Examples
    --------
    ::

        %horovod_timeline                    # the latest run's timeline, drawn
        %horovod_timeline --summary          # where the time went, per tensor and operation
        %horovod_timeline --list             # runs that have a timeline
        path = %horovod_timeline 3f2a --path # the file of the run whose id ends in 3f2a
    """
    from ..timelines.show import timeline_magic
    return timeline_magic(magics, line)
