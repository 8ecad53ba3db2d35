"""``--data df`` over a Parquet table: the ranks reading its files directly, against Spark's
own Arrow stage, ``toPandas()``, and a DataFrame converted once then reused, in one run.

A table of `--rows` rows × `--cols` float32 columns (default 10 million × 16: 640 MB) is
written as Parquet by an embedded ``local[N]`` session (`--block-mb` MB row groups). Then,
interleaved, `--reps` times each:

- ``shards``: ``hvd_magic.run(hold, np=N, data=spark.read.parquet(path))``, a plain scan: each
  rank calls ``hvd_magic.shard()`` (its rows in memory) and touches every value;
- ``stream``: the same DataFrame, each rank streams one epoch of ``numpy_batches(65536)``
  (shuffled): the seconds to its last batch, and to its **first** batch (``first-batch``);
- ``stream-4k``: the same, in batches of 4096 rows (every column, shuffled): what a trainer's
  loop asks for, where the per-batch costs show;
- ``converted``: a DataFrame that is not a plain scan (a computed column), converted once into
  the data cache before the repetitions (that first use is timed alone, ``converted-first``),
  then each repetition reuses it as ``shards`` does;
- ``toPandas``: ``frame = df.toPandas()`` (Arrow-enabled) and ``hvd_magic.run(hold, np=N,
  args=(frame,))``;
- ``petastorm``: its Spark converter, where it can be installed beside our pyarrow (otherwise
  the row says why not);
- ``spark-arrow`` (Spark's own floor for a Python stage): a bare ``mapInArrow(barrier=True)``
  stage whose tasks write the Arrow batches Spark feeds them to a local file, and nothing else:
  what the path before this one (``--data`` as a barrier stage over the DataFrame) cost at best.

Each way runs once on a small table first (Python workers, imports warm; not counted).

Then ``stream-rss``: a table 4× `--budget-mb` (default 256 MB: a 1 GiB shard) streamed by one
rank for two epochs (window of 2 row groups, shuffled); its RSS sampled every 10 ms, the peak
above its level before the first batch.

    .venv/bin/python bench/bench_shards.py [--rows 10000000] [--cols 16] [--np 4] [--reps 3]
                                           [--block-mb 16] [--budget-mb 256] [--quick]
                                           [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rows import row, write  # noqa: E402


def hold_shard():
    import time
    import psutil
    import pyarrow.compute as pc
    import hvd_magic
    before = psutil.Process().memory_info().rss
    table = hvd_magic.shard()
    held = time.time()
    total = sum(pc.sum(column).as_py() for column in table.columns)  # every page touched
    return held, table.num_rows, before, psutil.Process().memory_info().rss, total, None, None


def stream_epochs(epochs=1, batch=65536):
    """Every batch of `epochs` epochs; (end, rows, RSS before, peak RSS, sum, first batch at,
    seconds from the first call to the first batch)."""
    import threading
    import time
    import numpy  # noqa: F401  (loaded before the baseline: what every rank has)
    import psutil
    import pyarrow.parquet  # noqa: F401
    import hvd_magic
    proc = psutil.Process()
    before = peak = proc.memory_info().rss
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.wait(0.01):
            peak = max(peak, proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rows, total, first = 0, 0.0, None
    called = time.time()
    for epoch in range(epochs):
        for x in hvd_magic.numpy_batches(batch, epoch=epoch):
            first = first or time.time()
            rows += len(x[0])
            total += float(x[0].sum())
    done.set()
    sampler.join()
    return (time.time(), rows // epochs, before, max(peak, proc.memory_info().rss), total, first,
            first - called)


def write_partition(batches):
    """The floor's task: Spark's Arrow batches to a local file, as the barrier stage wrote them."""
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
    return held, len(frame), None, psutil.Process().memory_info().rss, total, None, None


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


def measure(way, df, np, cache):
    """(seconds until every rank held its data, rows, notebook RSS growth MB, largest rank
    RSS MB, its RSS before MB, (seconds to the first batch from the call, and from the rank's
    first call of numpy_batches)."""
    import hvd_magic

    rss = PeakRSS()
    begun = time.time()
    if way == "spark-arrow":
        out = df.mapInArrow(write_partition, "held double, rows long", barrier=True).collect()
        return (max(r.held for r in out) - begun, sum(r.rows for r in out), rss.growth_mb(),
                None, None, None)
    if way == "toPandas":
        frame = df.toPandas()
        run = hvd_magic.run(hold_frame, np=np, args=(frame,), view=None)
        del frame
    else:
        fn = stream_epochs if way.startswith("stream") else hold_shard
        run = hvd_magic.run(fn, np=np, data=df, view=None, data_cache=cache,
                            kwargs={"batch": 4096} if way == "stream-4k" else None)
    growth = rss.growth_mb()
    results = run.results
    seconds = max(r[0] for r in results) - begun
    rows = results[0][1] if way == "toPandas" else sum(r[1] for r in results)
    baseline = max((r[2] for r in results if r[2] is not None), default=None)
    first = ((max(r[5] for r in results) - begun, max(r[6] for r in results))
             if way == "stream" else None)
    return (seconds, rows, growth, max(r[3] for r in results) / 2**20,
            baseline and baseline / 2**20, first)


def plus_one(column):
    return (column + 1).cast("float")


def write_table(spark, path, rows, cols, parts, block_mb):
    from pyspark.sql import functions as F
    (spark.range(0, rows, 1, parts)
     .select(*[F.rand(seed=i).cast("float").alias(f"c{i}") for i in range(cols)])
     .write.option("parquet.block.size", block_mb << 20).parquet(path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--block-mb", type=int, default=16)
    parser.add_argument("--budget-mb", type=int, default=256)
    parser.add_argument("--quick", action="store_true",
                        help="1 million rows, 1 repetition, a 64 MB budget, 4 MB row groups")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.reps, args.budget_mb, args.block_mb = 1_000_000, 1, 64, 4

    from pyspark.sql import functions as F

    from hvd_magic.launch.spark import embedded_session

    # (files of up to 1 GB are one partition each: the barrier stage of the floor then has N
    # tasks, one per file, as the table is written in N files)
    spark = embedded_session(args.np, conf={"spark.driver.memory": "6g",
                                            "spark.sql.execution.arrow.pyspark.enabled": "true",
                                            "spark.sql.files.maxPartitionBytes": str(1 << 30)})
    work = tempfile.mkdtemp(prefix="bench_shards-")
    cache = os.path.join(work, "cache")
    try:
        write_table(spark, os.path.join(work, "small"), 1000, args.cols, args.np, args.block_mb)
        write_table(spark, os.path.join(work, "t"), args.rows, args.cols, args.np, args.block_mb)
        mb = args.rows * args.cols * 4 / 1e6
        print(f"{args.rows:,} rows × {args.cols} float32 columns = {mb:.0f} MB of Parquet "
              f"({args.block_mb} MB row groups), np={args.np}, load {os.getloadavg()[0]:.1f}",
              flush=True)
        table = spark.read.parquet(os.path.join(work, "t"))
        # Not a plain scan: converted. (The cast keeps c0 float32: float + 1 is a double in Spark,
        # which made the converted table 680 MB of Parquet beside the plain one's 640.)
        computed = table.withColumn("c0", plus_one(F.col("c0")))
        small = spark.read.parquet(os.path.join(work, "small"))
        frames = {"shards": table, "stream": table, "stream-4k": table, "converted": computed, "toPandas": table,
                  "spark-arrow": table}
        ways = list(frames)
        for way in ways:  # warm-up, not counted
            measure(way, small.withColumn("c0", plus_one(F.col("c0"))) if way == "converted" else small,
                    args.np, cache)
        first_use = measure("converted", computed, args.np, cache)[0]
        print(f"  converted-first {first_use:6.2f} s  {mb / first_use:7.0f} MB/s "
              f"(Spark writes it into the cache, the ranks read it)", flush=True)
        results = {way: [] for way in ways}
        for rep in range(args.reps):
            for way in ways[rep % len(ways):] + ways[:rep % len(ways)]:  # the order rotates
                seconds, rows, growth, rank_rss, baseline, first = measure(
                    way, frames[way], args.np, cache)
                assert rows == args.rows, (way, rows)
                results[way].append((seconds, growth, rank_rss, baseline, first))
                print(f"  {way:11s} {seconds:6.2f} s  {mb / seconds:7.0f} MB/s  notebook RSS "
                      f"+{growth:5.0f} MB"
                      + (f"  largest rank RSS {rank_rss:5.0f} MB" if rank_rss else "")
                      + (f" (before: {baseline:.0f} MB)" if baseline else "")
                      + (f"  first batch {first[0]:.2f} s ({first[1]:.2f} s in the rank)"
                         if first else ""), flush=True)
        reference = statistics.median(s for s, *_ in results["toPandas"])
        out = [row("shards", "converted-first", args.np, [first_use], ref=reference,
                   reference="toPandas", rows=args.rows, cols=args.cols, mb=mb,
                   mb_per_s=mb / first_use)]
        for way, values in results.items():
            seconds = [v[0] for v in values]
            out.append(row("shards", way, args.np, seconds, ref=reference, reference="toPandas",
                           rows=args.rows, cols=args.cols, mb=mb,
                           mb_per_s=mb / statistics.median(seconds),
                           notebook_rss_growth_mb=statistics.median(v[1] for v in values),
                           rank_rss_mb=(statistics.median(v[2] for v in values)
                                        if values[0][2] else None),
                           rank_rss_before_mb=(statistics.median(v[3] for v in values)
                                               if values[0][3] else None)))
            print(f"{way}: median {statistics.median(seconds):.2f} s, "
                  f"{mb / statistics.median(seconds):.0f} MB/s", flush=True)
        firsts = [v[4][0] for v in results["stream"]]
        in_rank = [v[4][1] for v in results["stream"]]
        out.append(row("shards", "first-batch", args.np, firsts, in_rank=in_rank))
        print(f"first batch: median {statistics.median(firsts):.2f} s from the call, "
              f"{statistics.median(in_rank):.2f} s from the rank's numpy_batches()", flush=True)
        out.append(stream_rss(spark, work, args))
        out.append(petastorm_row(args))
        write(args.json, out)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def petastorm_row(args):
    """Petastorm's converter, where it can run beside our pyarrow; otherwise why not."""
    import pyarrow
    try:
        from petastorm.spark import make_spark_converter  # noqa: F401
        why = "installed, not measured yet"
    except Exception as exc:  # ImportError, or its own imports of pyarrow.filesystem failing
        why = (f"cannot run beside pyarrow {pyarrow.__version__} ({type(exc).__name__}: {exc}): "
               "petastorm 0.13.1, its latest release, imports pyarrow.filesystem, which pyarrow "
               "15 removed (petastorm issues #805, #806)")
    print(f"petastorm: {why}", flush=True)
    return dict(row("shards", "petastorm", args.np, []), error=why)


def stream_rss(spark, work, args):
    """One rank streams a shard 4× its RSS budget for two epochs: its peak RSS above baseline."""
    import hvd_magic

    rows = 4 * args.budget_mb * 2**20 // (args.cols * 4)
    path = os.path.join(work, "big")
    write_table(spark, path, rows, args.cols, args.np, args.block_mb)
    run = hvd_magic.run(stream_epochs, np=1, kwargs={"epochs": 2},
                        data=spark.read.parquet(path), view=None)
    end, n, before, peak, *_ = run.results[0]
    growth = (peak - before) / 2**20
    shard_mb = rows * args.cols * 4 / 2**20
    print(f"stream-rss: a {shard_mb:.0f} MB shard ({rows:,} rows), 2 epochs: rank RSS "
          f"+{growth:.0f} MB over its {before / 2**20:.0f} MB baseline (budget "
          f"{args.budget_mb} MB)", flush=True)
    return row("shards-stream", "stream-rss", 1, [growth], unit="MB", shard_mb=shard_mb,
               budget_mb=args.budget_mb, rank_rss_before_mb=before / 2**20)


if __name__ == "__main__":
    main()
