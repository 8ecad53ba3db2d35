"""``%horovod_tensorboard``: the TensorBoard logs the ranks of a run wrote, shown in the notebook.

Each rank writes to ``hvd_magic.tensorboard_dir()`` (a folder of its own machine); its task sends
the folder back when the rank ends, to ``<run folder>/tensorboard/rank-<k>/`` or ``--tensorboard
DIR``. This finds that folder for a run of this kernel (the latest with logs, or the one named)
and starts TensorBoard's notebook view on it.
"""

import shlex

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .options import summary_first

from ..driver.history import runs


def logs_of(run_id=None):
    with_logs = [r for r in runs() if r.tensorboard_dir]
    if run_id is None:
        if not with_logs:
            raise UsageError("No run of this kernel has TensorBoard logs yet: write them to "
                             "hvd_magic.tensorboard_dir() on the ranks (SummaryWriter, "
                             "keras.callbacks.TensorBoard).")
        return with_logs[-1].tensorboard_dir
    matches = [r for r in with_logs if r.id == run_id or r.id.endswith(run_id)]
    if len(matches) != 1:
        known = ", ".join(r.id for r in with_logs) or "none yet"
        raise UsageError(f"{run_id!r} is not one run with TensorBoard logs (runs with logs: "
                         f"{known}).")
    return matches[0].tensorboard_dir


@summary_first
@magic_arguments()
@argument("run", nargs="?", default=None,
          help="The run: its id, or the end of it (default: the latest run of this kernel "
               "with TensorBoard logs).")
@argument("--path", action="store_true", help="Return the logs' folder instead.")
def horovod_tensorboard(magics, line):
    """Show the TensorBoard logs the ranks of a run wrote, in TensorBoard's notebook view.

    ::

        %%horovod --np -2
        from torch.utils.tensorboard import SummaryWriter
        import hvd_magic
        with SummaryWriter(hvd_magic.tensorboard_dir()) as writer:
            writer.add_scalar("loss", 0.5, 1)

        %horovod_tensorboard --path

    On the ranks, write to ``hvd_magic.tensorboard_dir()``; each rank's folder comes back
    when it ends, as ``rank-<k>/`` under the run folder's ``tensorboard/`` (or ``--tensorboard
    DIR``), so TensorBoard shows the ranks side by side.

    Examples
    --------
    ::

        %horovod_tensorboard                 # TensorBoard on the latest run's logs
        %horovod_tensorboard 3f2a --path     # the folder of the run whose id ends in 3f2a
    """
    args = parse_argstring(magics.horovod_tensorboard, line)
    path = logs_of(args.run)
    if args.path:
        return path
    try:
        from tensorboard import notebook
    except ImportError:
        raise UsageError(f"TensorBoard is not installed in this kernel (pip install tensorboard). "
                         f"The logs are in {path}.") from None
    notebook.start(f"--logdir {shlex.quote(path)}")
    return None
