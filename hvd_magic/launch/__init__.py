"""The function is launched: the launcher contract (`base.Launcher`) and its launchers.

- `spark`: one Spark barrier stage of N tasks on the active or an embedded SparkSession;
- `connect`: the same stage through a Spark Connect session (no SparkContext there);
- `frames`: ``--data`` DataFrames checked, and the barrier stage over a DataFrame;
- `local`: ``--np -N``, N tasks as threads of the driver, no Spark;
- `envcheck`: ``%horovod_env``, can the executors run ranks at all (versions, GPUs)?
"""


def make_launcher(np, spark=None, master=None, spark_conf=None, log_dir="hvd_runs", verbose=False,
                  elastic=None, session=False):
    """The launcher for `np` ranks: Spark for N > 0, the driver alone for -N; elastic when
    `elastic` is (min_np, max_np, timeout), for a warm session's ranks if `session`. A Spark JVM
    it starts writes to log_dir/spark-<time>.log (and, if `verbose`, to the cell's stderr too)."""
    if elastic is not None and session:
        from . import elastic_session
    if np < 0:
        if elastic is not None:
            from .elastic import ElasticLocalLauncher
            return (elastic_session.ElasticSessionLauncher if session
                    else ElasticLocalLauncher)(*elastic)
        from .local import LocalLauncher
        return LocalLauncher()
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
    spark_args = dict(session=spark, master=master, conf=spark_conf, log_dir=log_dir,
                      verbose=verbose)
    if elastic is not None:
        from .elastic_spark import ElasticSparkLauncher
        return (elastic_session.ElasticSparkSessionLauncher if session
                else ElasticSparkLauncher)(np, *elastic, **spark_args)
    from .spark import SparkLauncher
    return SparkLauncher(**spark_args)
