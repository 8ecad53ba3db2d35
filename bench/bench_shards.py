"""DataFrame shards (``--data df``) against ``toPandas()`` + sending the frame, in one run.

A DataFrame of `--rows` rows × `--cols` float32 columns (default 10 million × 16: 640 MB) is made
on the executors of an embedded ``local[N]`` session and cached there (so both ways read the same
materialised rows, and neither pays for generating them). Then, interleaved, `--reps` times each:

- ``shards``: ``hvd_magic.run(hold, np=N, data=df)``: each rank calls ``hvd_magic.shard()``;
- ``toPandas``: ``frame = df.toPandas()`` (Arrow-enabled, Spark's fastest way) and
  ``hvd_magic.run(hold, np=N, args=(frame,))``: each rank gets the whole frame;
- ``spark-arrow`` (the floor): a bare ``mapInArrow(barrier=True)`` stage whose tasks write the
  Arrow batches Spark feeds them to a local file, as ours do, and nothing else (no ranks): what
  Spark's own JVM-to-Python Arrow path costs on this machine.

Each way runs once on a 1,000-row DataFrame first (Python workers and imports warm, not counted).

Per way: **seconds** from the call until every rank holds its data (the latest rank's clock, same
machine), **MB/s** (the DataFrame's float bytes over those seconds), the notebook process's RSS
growth during the call (peak over its level before; sampled every 20 ms), and the largest rank RSS
after it touched every value of its data (and before it had any).

    .venv/bin/python bench/bench_shards.py [--rows 10000000] [--cols 16] [--np 4] [--reps 3]
                                           [--quick] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import statistics
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rows import row, write  # noqa: E402


def hold_shard():
    import os, time  # noqa: E401
    import psutil
    import pyarrow.compute as pc
    import hvd_magic
    before = psutil.Process().memory_info().rss
    table = hvd_magic.shard()
    held = time.time()
    total = sum(pc.sum(column).as_py() for column in table.columns)  # every page touched
    return held, table.num_rows, before, psutil.Process().memory_info().rss, total


def write_partition(batches):
    """The floor's task: Spark's Arrow batches to a local file, as `frame_task` writes them."""
    import os, tempfile, time  # noqa: E401
    import pyarrow as pa
    folder = tempfile.mkdtemp()
    path, writer, rows = os.path.join(folder, "part.arrow"), None, 0
    with pa.OSFile(path, "wb") as sink:
        for batch in batches:
            writer = writer or pa.ipc.new_file(sink, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
    os.unlink(path)
    os.rmdir(folder)
    yield pa.RecordBatch.from_pydict({"held": [time.time()], "rows": [rows]})


def hold_frame(frame):
    import time
    import psutil
    held = time.time()  # the frame is unpickled before the function is called
    total = float(frame.to_numpy().sum())
    return held, len(frame), None, psutil.Process().memory_info().rss, total


class PeakRSS:
    """The peak resident memory of this process above its level at the start."""

    def __init__(self, every=0.02):
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def growth_mb(self):
        self._stop.set()
        self._thread.join()
        return (max(self.peak, self.proc.memory_info().rss) - self.start) / 2**20


def measure(way, df, np):
    import hvd_magic

    rss = PeakRSS()
    begun = time.time()
    if way == "spark-arrow":
        out = df.mapInArrow(write_partition, "held double, rows long", barrier=True).collect()
        return (max(r.held for r in out) - begun, sum(r.rows for r in out), rss.growth_mb(),
                None, None)
    if way == "shards":
        run = hvd_magic.run(hold_shard, np=np, data=df, view=None)
    else:
        frame = df.toPandas()
        run = hvd_magic.run(hold_frame, np=np, args=(frame,), view=None)
        del frame
    growth = rss.growth_mb()
    seconds = max(r[0] for r in run.results) - begun
    rows = sum(r[1] for r in run.results) if way == "shards" else run.results[0][1]
    rank_rss = max(r[3] for r in run.results) / 2**20
    baseline = max((r[2] for r in run.results if r[2] is not None), default=None)
    return seconds, rows, growth, rank_rss, baseline and baseline / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 million rows, 1 repetition")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.reps = 1_000_000, 1

    from pyspark.sql import functions as F

    from hvd_magic.launch.spark import embedded_session

    spark = embedded_session(args.np, conf={"spark.driver.memory": "6g",
                                            "spark.sql.execution.arrow.pyspark.enabled": "true"})
    df = spark.range(0, args.rows, 1, args.np).select(
        *[F.rand(seed=i).cast("float").alias(f"c{i}") for i in range(args.cols)]).cache()
    df.count()
    mb = args.rows * args.cols * 4 / 1e6
    print(f"{args.rows:,} rows × {args.cols} float32 columns = {mb:.0f} MB, cached, "
          f"np={args.np}, load {os.getloadavg()[0]:.1f}", flush=True)
    ways = ["shards", "toPandas", "spark-arrow"]
    small = spark.range(0, 1000, 1, args.np).select(
        *[F.rand(seed=i).cast("float").alias(f"c{i}") for i in range(args.cols)])
    for way in ways:  # warm-up, not counted
        measure(way, small, args.np)
    results = {way: [] for way in ways}
    for rep in range(args.reps):
        for way in ways[rep % 3:] + ways[:rep % 3]:  # the order rotates
            seconds, rows, growth, rank_rss, baseline = measure(way, df, args.np)
            assert rows == args.rows, (way, rows)
            results[way].append((seconds, growth, rank_rss, baseline))
            print(f"  {way:11s} {seconds:6.2f} s  {mb / seconds:7.0f} MB/s  notebook RSS "
                  f"+{growth:5.0f} MB" + (f"  largest rank RSS {rank_rss:5.0f} MB" if rank_rss else "")
                  + (f" (before its shard: {baseline:.0f} MB)" if baseline else ""), flush=True)
    reference = statistics.median(s for s, *_ in results["toPandas"])
    rows = []
    for way, values in results.items():
        seconds = [v[0] for v in values]
        rows.append(row("shards", way, args.np, seconds, ref=reference, reference="toPandas",
                        rows=args.rows, cols=args.cols, mb=mb,
                        mb_per_s=mb / statistics.median(seconds),
                        notebook_rss_growth_mb=statistics.median(v[1] for v in values),
                        rank_rss_mb=(statistics.median(v[2] for v in values)
                                     if values[0][2] else None),
                        rank_rss_before_mb=(statistics.median(v[3] for v in values)
                                            if values[0][3] else None)))
        print(f"{way}: median {statistics.median(seconds):.2f} s, "
              f"{mb / statistics.median(seconds):.0f} MB/s", flush=True)
    write(args.json, rows)
    spark.stop()


if __name__ == "__main__":
    main()
