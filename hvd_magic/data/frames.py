"""DataFrames on the driver's side: checking a ``--data`` DataFrame and the plan its ranks read
it by.

`data_plan`: a plain Parquet scan is read by the ranks from its own files
(`hvd_magic.data.parquet`); any other DataFrame is written once by Spark into the data cache
(`hvd_magic.data.cache`) and read from there. Nothing here collects rows.

Not for: launching (the launchers call `check_data` and `data_plan`), nor the ranks' side of the
data (`hvd_magic.rank.stream`, `hvd_magic.rank.data`).
"""

from IPython.core.error import UsageError


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
    """The plan of `df` for `np` ranks (`hvd_magic.data.plan`): `check` is `check_data`
    with the launcher's session bound; `local` whether the executors share this machine's
    disk; `cache` the configured cache directory (or None)."""
    from .cache import cache_dir, converted
    from .plan import build_plan
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

