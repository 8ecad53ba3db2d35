"""A barrier task over a DataFrame: ``df.mapInArrow(frame_task, barrier=True)``.

Used for ``--data df`` (the stage runs over the DataFrame's own partitions, so each task's rows
come from Spark on its executor, never through the driver) and for every launch through Spark
Connect (over ``spark.range(N)``, whose rows are ignored: Connect can only run DataFrames).

1. The task writes the rows Spark feeds it to a local Arrow IPC file, batch by batch (a task
   holds one batch at a time);
2. it runs its rank exactly as an RDD barrier task does (`runner.run_task`), with the file's path
   for `hvd_magic.shard()`; the tasks agree on the shards' sizes through the driver first;
3. it yields its outcome, pickled and cut into rows of at most `CHUNK` bytes, so that results
   of any size stay under Spark Connect's gRPC message limit (`outcomes` joins them again).
"""

import os
import pickle
import shutil
import tempfile

from .runner import run_task
from .settings import SparkCoordinator

OUTCOME_SCHEMA = "task long, seq long, chunk binary"
CHUNK = 1 << 20


class ShardFile:
    """This task's rows, written to `path` (None when Spark gave it none)."""

    def __init__(self, path, rows):
        self.path = path
        self.rows = rows


def write_shard(batches, folder):
    """Write Arrow record batches to folder/shard.arrow; a `ShardFile`."""
    import pyarrow as pa

    path = os.path.join(folder, "shard.arrow")
    rows, writer = 0, None
    with pa.OSFile(path, "wb") as sink:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_file(sink, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
    return ShardFile(path if writer is not None else None, rows)


def frame_task(settings, batches):
    """mapInArrow's function: this task's shard, its rank's run, its outcome in chunks."""
    import pyarrow as pa

    coord = SparkCoordinator()
    folder = tempfile.mkdtemp(prefix=f"hvd_magic-{settings.run_id}-shard{coord.partition_id}-")
    try:
        if settings.data:
            shard = write_shard(batches, folder)
        else:
            for _ in batches:  # spark.range(N)'s one row per task: nothing to keep
                pass
            shard = None
        outcome = run_task(settings, coord, shard=shard)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    schema = pa.schema([("task", pa.int64()), ("seq", pa.int64()), ("chunk", pa.binary())])
    for seq, start in enumerate(range(0, max(len(data), 1), CHUNK)):
        yield pa.RecordBatch.from_pydict(
            {"task": [coord.partition_id], "seq": [seq], "chunk": [data[start:start + CHUNK]]},
            schema=schema)


def outcomes(rows):
    """The tasks' ``(rank, status, payload)`` outcomes from the stage's collected rows."""
    pieces = {}
    for row in rows:
        pieces.setdefault(row["task"], []).append((row["seq"], bytes(row["chunk"])))
    return [pickle.loads(b"".join(chunk for _, chunk in sorted(parts)))
            for _, parts in sorted(pieces.items())]
