"""The function is launched: the launcher contract (`base.Launcher`) and its launchers.

- `spark`: one Spark barrier stage of N tasks on the active or an embedded SparkSession;
- `connect`: the same stage through a Spark Connect session (no SparkContext there);
- `elastic/`: ``--min-np``, the elastic launchers' room: Horovod's elastic driver here, or our
  own membership for torch.distributed (`hvd_magic.elastic`);
- `local`: ``--np -N``, N tasks as threads of the driver, no Spark;
- `envcheck`: ``%horovod_env``, can the executors run ranks at all (versions, GPUs)?

The driver side of ``--data`` (its DataFrame checked and planned) is `hvd_magic.data`.
"""

from ..needs import broken_message, import_error, installed, missing_message


def make_launcher(placement, session=False, elastic_kind="horovod"):
    """The launcher for a `hvd_magic.config.Placement`: Spark for N > 0, the driver alone for
    -N; elastic when it asks for `min_np` (Horovod's elastic driver, or our own membership for
    torch.distributed where `elastic_kind` is ``"torch"``); for a warm session's ranks if
    `session`. A Spark JVM
    it starts writes to its log_dir/spark-<time>.log (and, if `verbose`, to the cell's stderr)."""
    launcher = _launcher(placement, session, elastic_kind)
    if placement.elastic is not None:  # (what its driver does when every rank is lost)
        launcher.restart_from_scratch = placement.restart_from_scratch
    return launcher


def _launcher(placement, session, elastic_kind):
    np, spark, elastic = placement.np, placement.spark, placement.elastic
    if elastic is not None and session:
        from .elastic import session as elastic_session
    torch = elastic is not None and elastic_kind == "torch"
    if np < 0 and torch:
        from .elastic import ddp
        return (ddp.ElasticTorchSessionLauncher if session
                else ddp.ElasticTorchLocalLauncher)(*elastic)
    if np < 0:
        if elastic is not None:
            from .elastic.launcher import ElasticLocalLauncher
            return (elastic_session.ElasticSessionLauncher if session
                    else ElasticLocalLauncher)(*elastic)
        from .local import LocalLauncher
        return LocalLauncher()
    needed_by = f"Running {np} ranks as Spark tasks (--np {np})"
    broken = None if not installed("pyspark") else import_error("pyspark")
    if not installed("pyspark") or broken:
        from IPython.core.error import UsageError
        raise UsageError(
            (broken_message("pyspark", needed_by, broken) if broken
             else missing_message("pyspark", needed_by))
            + f" Or run them on this machine alone, without Spark or Java: --np -{np}.")
    from .connect import ConnectLauncher, connect_session
    connect = connect_session(spark)
    if connect is not None:
        if elastic is not None:
            from IPython.core.error import UsageError
            raise UsageError("elastic runs need a classic SparkSession (their slots are plain "
                             "Spark tasks that talk to this notebook); Spark Connect cannot run "
                             "them yet. Use a classic session, or --np -N --min-np M on the "
                             "driver.")
        return ConnectLauncher(connect)
    spark_args = dict(session=spark, master=placement.master, conf=placement.spark_conf,
                      log_dir=placement.log_dir, verbose=placement.verbose)
    if torch:
        from .elastic import ddp
        return (ddp.ElasticTorchSparkSessionLauncher if session
                else ddp.ElasticTorchSparkLauncher)(np, *elastic, **spark_args)
    if elastic is not None:
        from .elastic.spark import ElasticSparkLauncher
        return (elastic_session.ElasticSparkSessionLauncher if session
                else ElasticSparkLauncher)(np, *elastic, **spark_args)
    from .spark import SparkLauncher
    return SparkLauncher(**spark_args)

