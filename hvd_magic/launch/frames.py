"""DataFrames on the driver's side: checking a ``--data`` DataFrame, the plan its ranks read it
by, and the barrier stage over a DataFrame that Spark Connect launches run
(`hvd_magic.task.connect_stage.frame_task` on each task).

`data_plan`: a plain Parquet scan is read by the ranks from its own files
(`hvd_magic.launch.parquet`); any other DataFrame is written once by Spark into the data cache
(`hvd_magic.launch.datacache`) and read from there. Nothing here collects rows.
"""

import functools

from IPython.core.error import UsageError

from ..task.connect_stage import OUTCOME_SCHEMA, frame_task, outcomes


def is_dataframe(value):
    """A classic or a Spark Connect DataFrame (without importing Connect's client)."""
    return any(f"{k.__module__}.{k.__name__}" in ("pyspark.sql.dataframe.DataFrame",
                                                   "pyspark.sql.connect.dataframe.DataFrame",
                                                   "pyspark.sql.classic.dataframe.DataFrame")
               for k in type(value).__mro__)


def _unsupported_columns(df):
    """(columns to turn into arrays: ML vectors, columns Arrow cannot carry, as 'name (type)')."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import UserDefinedType

    vectors, bad = [], []
    for field in df.schema.fields:
        kind = field.dataType
        if isinstance(kind, UserDefinedType) and type(kind).__name__ == "VectorUDT":
            vectors.append(field.name)
            continue
        try:
            if isinstance(kind, UserDefinedType):
                raise TypeError(type(kind).__name__)
            to_arrow_type(kind, timezone="UTC")
        except Exception:
            bad.append(f"{field.name} ({kind.simpleString()})")
    return vectors, bad


def check_data(df, np, session, same_session):
    """The DataFrame the stage will run over (ML vectors as arrays), or a UsageError that says
    what is wrong with `df` and what to do."""
    if not is_dataframe(df):
        raise UsageError(f"--data takes a Spark DataFrame, not a {type(df).__name__}. For pandas "
                         "or numpy data, name the variable in the cell instead; for a file, "
                         "spark.read it first.")
    if not same_session(df):
        raise UsageError(
            "--data: this DataFrame belongs to another SparkSession than the one the ranks run "
            f"on ({session}), perhaps one that was stopped since. Create it again from the "
            "active session (e.g. spark.read / spark.createDataFrame).")
    vectors, bad = _unsupported_columns(df)
    if bad:
        raise UsageError(
            f"--data: Spark cannot send column{'s' if len(bad) > 1 else ''} {', '.join(bad)} "
            "as Arrow. Drop or convert them first, e.g. df.drop(...) or "
            "df.withColumn(name, df[name].cast('string')).")
    if vectors:
        from pyspark.ml.functions import vector_to_array
        df = df.withColumns({name: vector_to_array(df[name]) for name in vectors})
    return df


def data_plan(df, np, check, local, cache):
    """The plan of `df` for `np` ranks (`hvd_magic.launch.dataplan`): `check` is `check_data`
    with the launcher's session bound; `local` whether the executors share this machine's
    disk; `cache` the configured cache directory (or None)."""
    from .datacache import cache_dir, converted
    from .dataplan import build_plan
    from .parquet import NotDirect, scan

    df = check(df)
    try:
        files, columns, spec = scan(df)
        source = f"read directly from {len(files)} Parquet file{'s' if len(files) > 1 else ''}"
    except NotDirect as why:
        directory = cache_dir(cache, local)
        files, reused = converted(df, directory)
        columns, spec = list(df.columns), None
        source = (f"{'reused' if reused else 'converted once'} ({why}) in {directory}")
    return build_plan(files, columns, spec, np, source)


def barrier_stage(frame, settings):
    """The barrier stage of `frame_task` over `frame`'s partitions, as a DataFrame to collect."""
    return frame.mapInArrow(functools.partial(frame_task, settings), OUTCOME_SCHEMA, barrier=True)


def collect_outcomes(stage):
    """Run the stage; (the tasks' outcomes in task order, the events of tasks that could not
    reach the driver, to be applied now)."""
    return outcomes(stage.collect())
