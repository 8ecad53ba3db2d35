"""Pickle the values a run sends to its ranks, one by one, so that every one that cannot travel
is named at once, with advice, before any job starts."""

from IPython.core.error import UsageError

from .. import payload

# What to do instead, by the type name of a value that cannot be pickled.
_ADVICE = {
    "SparkSession": "Spark objects live on the driver only; read the data inside {inside} "
                    "(or pass a pandas/numpy copy)",
    "SparkContext": "Spark objects live on the driver only; create what you need inside {inside}",
    "DataFrame": "a Spark DataFrame lives on the driver; give it to the ranks as shards with "
                 "--data NAME (each rank reads its rows with hvd_magic.shard()), pass "
                 "df.toPandas() if it is small, or read the data inside {inside}",
    "SummaryWriter": "create it inside {inside}",
    "TextIOWrapper": "open the file inside {inside}",
    "BufferedReader": "open the file inside {inside}",
    "BufferedWriter": "open the file inside {inside}",
    "socket": "open the connection inside {inside}",
    "generator": "build the generator inside {inside} (or pass list(...) of it)",
    "lock": "create it inside {inside}",
    "Thread": "start threads inside {inside}",
}


def pickle_values(values, kind="name", inside="the cell"):
    """Pickle each value on its own (`payload.dumps`: bytes, or an OutOfBand for a large array);
    raise UsageError naming every one that cannot travel.

    `inside` is where the advice says to create such a value instead ("the cell", "train()").
    """
    pickled, failures = {}, []
    for name, value in values.items():
        try:
            pickled[name] = payload.dumps(value)  # large arrays: views of them, not a copy
        except Exception as exc:  # pickling can fail with almost any exception type
            type_name = type(value).__name__
            advice = _ADVICE.get(type_name) or next(
                (a for key, a in _ADVICE.items() if key.lower() in type_name.lower()),
                "create it inside {inside}, or pass something picklable")
            reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            advice = advice.format(inside=inside)
            failures.append(f"  `{name}` ({type_name}) cannot be sent to the ranks: {advice}. "
                            f"[{reason}]")
    if failures:
        raise UsageError(f"{len(failures)} {kind}{'s' if len(failures) > 1 else ''} cannot be "
                         "pickled, so no job was started:\n" + "\n".join(failures))
    return pickled
