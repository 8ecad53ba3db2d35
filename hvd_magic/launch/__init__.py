"""The function is launched: the launcher contract (`base.Launcher`) and its launchers.

- `spark`: one Spark barrier stage of N tasks on the active or an embedded SparkSession;
- `connect`: the same stage through a Spark Connect session (no SparkContext there);
- `frames`: ``--data`` DataFrames checked, and the barrier stage over a DataFrame;
- `local`: ``--np -N``, N tasks as threads of the driver, no Spark;
- `envcheck`: ``%horovod_env``, can the executors run ranks at all (versions, GPUs)?
"""


def make_launcher(np, spark=None, master=None, spark_conf=None, log_dir="hvd_runs", verbose=False):
    """The launcher for `np` ranks: Spark for N > 0, the driver alone for -N. A Spark JVM it
    starts writes to log_dir/spark-<time>.log (and, if `verbose`, to the cell's stderr too)."""
    if np < 0:
        from .local import LocalLauncher
        return LocalLauncher()
    from .connect import ConnectLauncher, connect_session
    connect = connect_session(spark)
    if connect is not None:
        return ConnectLauncher(connect)
    from .spark import SparkLauncher
    return SparkLauncher(session=spark, master=master, conf=spark_conf, log_dir=log_dir,
                         verbose=verbose)
