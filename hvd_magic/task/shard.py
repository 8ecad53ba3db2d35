"""A barrier task over a DataFrame: ``df.mapInArrow(frame_task, barrier=True)``.

Used for ``--data df`` (the stage runs over the DataFrame's own partitions, so each task's rows
come from Spark on its executor, never through the driver) and for every launch through Spark
Connect (over ``spark.range(N)``, whose rows are ignored: Connect can only run DataFrames).

1. The task writes the rows Spark feeds it to a local Arrow IPC file, batch by batch (a task
   holds one batch at a time), in a thread;
2. meanwhile it runs its rank exactly as an RDD barrier task does (`runner.run_task`), with the
   file's path for `hvd_magic.shard()`, which waits until the rows are written and the tasks have
   agreed on the shards' sizes through the driver;
3. it yields its outcome, pickled and cut into rows of at most `CHUNK` bytes, so that results
   of any size stay under Spark Connect's gRPC message limit (`outcomes` joins them again).
"""

import os
import pickle
import shutil
import tempfile
import threading

from .link import DriverLink
from .offline import OfflineLink, reach_driver
from .runner import run_task
from .settings import SparkCoordinator

OUTCOME_SCHEMA = "task long, kind string, seq long, chunk binary"
CHUNK = 1 << 20


def shards_message(counts, equal):
    """What the user reads about the shards of a ``--data`` run."""
    total, np = sum(counts), len(counts)
    if total == 0:
        return "--data: the DataFrame is empty; there is nothing to train on."
    if total < np:
        return (f"--data: the DataFrame has {total} row{'s' if total > 1 else ''}, fewer than the "
                f"{np} ranks; every rank needs rows of its own. Use --np {total} or more data.")
    if min(counts) == 0:
        empty = [rank for rank, n in enumerate(counts) if n == 0]
        return (f"--data: rank {empty[0]}'s shard is empty ({total:,} rows in {np} shards: "
                f"{', '.join(f'{n:,}' for n in counts)}), and a rank with no rows would leave the "
                f"others waiting in their collectives. Use fewer ranks, or a DataFrame with more "
                f"rows (df.repartition({np}) first spreads a small one evenly).")
    if equal:
        dropped = total - np * min(counts)
        return (f"--data: {np} shards of {min(counts):,} rows each (--equal-shards dropped "
                f"{dropped:,} of {total:,} rows)")
    low, high = min(counts), max(counts)
    size = f"{low:,}" if low == high else f"{low:,} to {high:,}"
    hint = "" if low == high else " (--equal-shards gives every rank the same number)"
    return f"--data: {total:,} rows in {np} shards of {size} rows{hint}"


class ShardFile:
    """This task's rows, written to `path` by `write` (in a thread of its own, while the rank
    starts); `written` is set when all are there (`rows` of them, or `error`). The rank reads
    them once the task has written to `ready` how many it may use."""

    def __init__(self, folder):
        self.path = os.path.join(folder, "shard.arrow")
        self.ready = os.path.join(folder, "shard.rows")
        self.rows = 0
        self.error = None
        self.written = threading.Event()

    def write(self, batches):
        """Write Arrow record batches to the file, one at a time."""
        import pyarrow as pa

        writer = None
        try:
            with pa.OSFile(self.path, "wb") as sink:
                for batch in batches:
                    if writer is None:
                        writer = pa.ipc.new_file(sink, batch.schema)
                    writer.write_batch(batch)
                    self.rows += batch.num_rows
                if writer is not None:
                    writer.close()
        except Exception as exc:  # told to the user; the run stops as for an empty shard
            self.rows, self.error = 0, f"{type(exc).__name__}: {exc}"
        finally:
            self.written.set()


def frame_task(settings, batches):
    """mapInArrow's function: this task's shard, its rank's run, its outcome in chunks (and,
    when the driver could not be reached, every event the rank would have sent it live)."""
    coord = SparkCoordinator()
    folder = tempfile.mkdtemp(prefix=f"hvd_magic-{settings.run_id}-shard{coord.partition_id}-")
    events_path = os.path.join(folder, "events.jsonl")
    offline = False
    try:
        shard = writer = None
        if settings.data:
            shard = ShardFile(folder)
            writer = threading.Thread(target=shard.write, args=(batches,), daemon=True,
                                      name="hvd-magic-shard-writer")
            writer.start()
        else:
            for _ in batches:  # spark.range(N)'s one row per task: nothing to keep
                pass
        make_link = None
        if settings.connect:  # the executors may not reach the notebook: all live, or none
            client, why = reach_driver(settings, coord)
            offline = client is None
            make_link = ((lambda rank: OfflineLink(settings, rank, coord, events_path, why))
                         if offline else (lambda rank: DriverLink(settings, rank, client)))
        if offline and settings.session:  # its cells come over the link: none without it
            outcome = (coord.partition_id, "error", {
                "rank": coord.partition_id, "type": "ConnectionError", "message": (
                    f"a warm session needs its ranks to reach this notebook, and the Spark "
                    f"executors could not reach it at {settings.events_address} ({why}). Set "
                    f"HVD_MAGIC_DRIVER_HOST to an address of this machine that they can reach.")})
        else:
            outcome = run_task(settings, coord, shard=shard, make_link=make_link)
        if writer is not None:
            writer.join()  # (Spark's input is read to its end before the output is sent)
        yield from _rows(coord.partition_id, "outcome",
                         pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL))
        if offline and os.path.exists(events_path):
            with open(events_path, "rb") as f:
                yield from _rows(coord.partition_id, "events", f.read())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rows(task, kind, data):
    import pyarrow as pa

    schema = pa.schema([("task", pa.int64()), ("kind", pa.string()), ("seq", pa.int64()),
                        ("chunk", pa.binary())])
    for seq, start in enumerate(range(0, max(len(data), 1), CHUNK)):
        yield pa.RecordBatch.from_pydict({"task": [task], "kind": [kind], "seq": [seq],
                                          "chunk": [data[start:start + CHUNK]]}, schema=schema)


def outcomes(rows):
    """(the tasks' ``(rank, status, payload)`` outcomes, the events of tasks that could not
    reach the driver) from the stage's collected rows."""
    import json

    pieces = {}
    for row in rows:
        pieces.setdefault((row["kind"], row["task"]), []).append((row["seq"], bytes(row["chunk"])))
    joined = {key: b"".join(chunk for _, chunk in sorted(parts)) for key, parts in pieces.items()}
    results = [pickle.loads(data) for (kind, _), data in sorted(joined.items()) if kind == "outcome"]
    events = [json.loads(line) for (kind, _), data in sorted(joined.items()) if kind == "events"
              for line in data.splitlines() if line.strip()]
    return results, events
