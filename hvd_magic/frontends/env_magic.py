"""``%horovod_env``: can the executors run ranks at all? Their packages and GPUs beside the
driver's (the probe and its report are `hvd_magic.launch.envcheck` / `envreport`)."""

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .options import summary_first


@summary_first
@magic_arguments()
@argument("--timeout", type=float, default=120.0,
          help="Seconds the probe job may wait for its task slots (default 120).")
@argument("--text", action="store_true",
          help="Print a plain-text table (to paste into an issue) instead of returning "
               "the report.")
def horovod_env(magics, line):
    """Compare the Python packages and GPUs of every Spark executor with the driver's.

    ::

        %horovod_env

    A short Spark job with a task in every slot reports, per executor: the Python,
    cloudpickle, torch, TensorFlow, horovod (built against which torch and TensorFlow? with
    Gloo? NCCL?), hvd_magic and pyspark versions, and the GPUs it sees (CUDA_VISIBLE_DEVICES, torch's device count, the GPUs Spark assigns
    its tasks). Values that differ from the driver's are highlighted; a package that an
    executor lacks is reported as missing. Different Python or cloudpickle versions are the
    commonest cause of a cell that unpickles on the driver but not on the workers; a
    Horovod built against another torch or TensorFlow than the installed one gets a note, and
    so does what a run on this cluster sends to executors that lack it (hvd_magic, the job's
    packages: ``--ship``).
    Returns the report (``hvd_magic.launch.envcheck.EnvReport``; its ``mismatches`` list them).

    Examples
    --------
    ::

        %horovod_env                    # a table of the driver and every executor
        report = %horovod_env
        report.mismatches               # [Mismatch(where='10.0.0.7:41234', what='cloudpickle', ...)]
        %horovod_env --text             # plain text, to paste into an issue
    """
    from ..launch.connect import connect_session
    from ..launch.envcheck import check
    from ..launch.shipping import what_ships

    args = parse_argstring(horovod_env, line)
    if connect_session() is not None:
        raise UsageError("%horovod_env needs a classic SparkSession (it asks every executor "
                         "through the SparkContext), and the active one is Spark Connect.")
    if args.timeout <= 0:
        raise UsageError("--timeout takes a positive number of seconds.")
    report = check(timeout=args.timeout)
    report.notes.append(what_ships(report.master))
    if args.text:
        print(report.text())
        return None
    return report
