"""The barrier task of a Spark Connect launch: ``spark.range(N).mapInArrow(frame_task,
barrier=True)`` (Connect can only run DataFrames; the rows are ignored).

1. The task runs its rank exactly as an RDD barrier task does (`runner.run_task`), after
   checking that it can reach the notebook (or running offline: `hvd_magic.task.offline`);
2. it yields its outcome, pickled and cut into rows of at most `CHUNK` bytes, so that results
   of any size stay under Spark Connect's gRPC message limit (`outcomes` joins them again).

``--data`` rows do not pass through here: ranks read them from Parquet files
(`hvd_magic.rank.stream`).
"""

import os
import pickle
import shutil
import tempfile

from .link import DriverLink
from .offline import OfflineLink, reach_driver
from .runner import run_task
from .settings import SparkCoordinator

OUTCOME_SCHEMA = "task long, kind string, seq long, chunk binary"
CHUNK = 1 << 20


def frame_task(settings, batches):
    """mapInArrow's function: its rank's run, its outcome in chunks (and, when the driver could
    not be reached, every event the rank would have sent it live)."""
    coord = SparkCoordinator()
    folder = tempfile.mkdtemp(prefix=f"hvd_magic-{settings.run_id}-task{coord.partition_id}-")
    events_path = os.path.join(folder, "events.jsonl")
    offline = False
    try:
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
            outcome = run_task(settings, coord, make_link=make_link)
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
