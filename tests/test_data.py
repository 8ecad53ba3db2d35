"""``--data df``: DataFrame shards made by Spark on the executors, read on the ranks with
`hvd_magic.shard()`; --equal-shards; every bad --data gets its message. Real Spark (the embedded
local session), real ranks."""

import os

import pytest
from IPython.core.error import UsageError

import hvd_magic
from conftest import spark_session
from hvd_magic.launch.spark import embedded_session

SHARD_CELL = """\
import numpy as np, torch, horovod.torch as hvd
hvd.init()
table = hvd_magic.shard()
ids = table.column("id").to_numpy()
x, arr = next(hvd_magic.torch_batches(4, ("x", ["x", "arr", "vec"]), shuffle=False))
(hvd.rank(), sorted(ids.tolist()), float(table.column("x").to_numpy().sum()),
 {f.name: str(f.type) for f in table.schema}, tuple(arr.shape), hvd_magic.shard() is table,
 table.column("s")[0].as_py() == str(ids[0]), table.column("ts")[0].as_py().year)
"""


@pytest.fixture(scope="module")
def spark():
    yield spark_session(4)


@pytest.fixture
def frame(spark):
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import functions as F

    vectors = spark.createDataFrame([(i, Vectors.dense([i, 2.0 * i])) for i in range(1001)],
                                    ["id", "vec"])
    return (vectors.repartition(3)
            .withColumn("x", (F.col("id") * 0.5).cast("float"))
            .withColumn("arr", F.array(F.col("id").cast("float"), F.lit(1.0).cast("float")))
            .withColumn("s", F.col("id").cast("string"))
            .withColumn("ts", F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id"))))


def test_shards_are_disjoint_and_add_up_to_the_dataframe(ip, fresh_ns, frame, capsys):
    fresh_ns["df"] = frame
    ip.run_cell_magic("horovod", "--np 4 --data df --text", "import hvd_magic\n" + SHARD_CELL)
    run = hvd_magic.last_run()
    results = sorted(run.results)
    ids = [i for r in results for i in r[1]]
    assert sorted(ids) == list(range(1001))          # every row, once: disjoint and complete
    assert all(len(r[1]) > 0 for r in results)
    assert sum(r[2] for r in results) == pytest.approx(sum(range(1001)) * 0.5)
    assert run.shards == [len(r[1]) for r in results]
    types = results[0][3]
    assert types["id"] == "int64" and types["x"] == "float" and types["s"] == "string"
    assert types["arr"].startswith("list<") and types["ts"].startswith("timestamp")
    assert types["vec"].startswith("list<element: double")  # an ML vector arrives as an array
    assert results[0][4] == (4, 5)                   # x, arr (2 values) and vec (2) side by side
    assert all(r[5] for r in results)                # shard() again: the same table, no copy
    assert all(r[6] for r in results) and {r[7] for r in results} == {2023}
    out = capsys.readouterr()
    assert "--data: 1,001 rows in 4 shards of" in out.out  # news, not stderr (red in a notebook)


def test_equal_shards_even_the_ranks_and_say_what_was_dropped(ip, fresh_ns, spark, capsys):
    # 43 rows: shares of 10 or 11 (converted once, then reused by the second cell)
    fresh_ns["df"] = spark.range(0, 43, 1, 4)
    cell = "import hvd_magic\nhvd_magic.shard().num_rows"
    ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
    assert sorted(hvd_magic.last_run().results) == [10, 11, 11, 11]
    ip.run_cell_magic("horovod", "--np 4 --data df --equal-shards --text", cell)
    assert hvd_magic.last_run().results == [10, 10, 10, 10]
    out = capsys.readouterr().out
    assert "43 rows in 4 shards of 10 to 11 rows, converted once" in out
    assert "rows each (--equal-shards dropped 3 of 43 rows), reused" in out
    assert "4 shards of 10 rows each (--equal-shards dropped 3 of 43 rows)" in out


@pytest.mark.parametrize("make, message", [
    (lambda spark: 5, "--data df: df is a int, not a Spark DataFrame. For pandas"),
    (lambda spark: spark.range(0), "the DataFrame is empty"),
    (lambda spark: spark.range(3), "has 3 rows, fewer than the 4 ranks; every rank needs rows "
                                   "of its own. Use --np 3"),
    (lambda spark: spark.sql("select id, make_interval(0, 1) as gap from range(10)"),
     r"cannot send column gap \(interval\) as Arrow"),
])
def test_bad_data_gets_its_message(ip, fresh_ns, spark, make, message):
    fresh_ns["df"] = make(spark)
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("horovod", "--np 4 --data df --text", "1")


def test_data_options_without_a_dataframe(ip, fresh_ns):
    with pytest.raises(UsageError, match="the notebook has no variable 'nothing_here'"):
        ip.run_cell_magic("horovod", "--np 2 --data nothing_here", "1")
    with pytest.raises(UsageError, match="--equal-shards evens the shards of --data"):
        ip.run_cell_magic("horovod", "--np 2 --equal-shards", "1")
    fresh_ns["frame"] = _FakeFrameType()
    # one check, one message, whichever door (hvd_magic.config.check_together)
    message = r"--data \(data=\) needs Spark.* --np 2 \(np=2, .*\) instead of --np -2"
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("horovod", "--np -2 --data frame", "1")
    with pytest.raises(UsageError, match=message):
        hvd_magic.run(lambda: 1, np=-2, data=_FakeFrameType())


class _FakeFrameType:
    """Stands for a DataFrame in the one check that happens before Spark is asked anything."""


_FakeFrameType.__module__ = "pyspark.sql.dataframe"
_FakeFrameType.__name__ = "DataFrame"


def test_a_dataframe_named_in_the_cell_says_use_data(ip, fresh_ns, spark):
    fresh_ns["df"] = spark.range(10)
    with pytest.raises(UsageError, match=r"--data NAME \(each rank reads its rows with "
                                         r"hvd_magic.shard\(\)\)"):
        ip.run_cell_magic("horovod", "--np 2 --text", "df.count()")


@pytest.fixture(scope="module")
def table_dir(spark, tmp_path_factory):
    """1,000 rows written by Spark as Parquet: 3 files of several small row groups each."""
    from pyspark.sql import functions as F

    path = str(tmp_path_factory.mktemp("parquet") / "t")
    (spark.range(0, 1000, 1, 3).withColumn("x", (F.col("id") * 0.5).cast("float"))
     .withColumn("s", F.col("id").cast("string"))
     .write.option("parquet.block.size", 2048).parquet(path))
    return path


STREAM_CELL = """import hvd_magic, horovod.torch as hvd
hvd.init()
epoch0 = [b.tolist() for b in hvd_magic.numpy_batches(16, "id", epoch=0, seed=3)]
epoch1 = [b.tolist() for b in hvd_magic.numpy_batches(16, "id", epoch=1, seed=3)]
resumed = [b.tolist() for b in hvd_magic.numpy_batches(16, "id", epoch=1, seed=3, start_batch=5)]
x, s = next(hvd_magic.torch_batches(8, ("x", "s"), shuffle=False))
(epoch0, epoch1 == epoch1, resumed == epoch1[5:], epoch0 != epoch1, tuple(x.shape), list(s[:2]),
 hvd_magic.shard().column_names, hvd_magic.batch_count(16, drop_last=True))
"""


def test_a_parquet_scan_is_read_directly_in_equal_seeded_resumable_batches(
        ip, fresh_ns, spark, table_dir, capsys):
    fresh_ns["df"] = spark.read.parquet(table_dir).where("id >= 100").select("id", "x", "s")
    ip.run_cell_magic("horovod", "--np 3 --data df --text", STREAM_CELL)
    results = hvd_magic.last_run().results
    assert hvd_magic.last_run().shards == [300, 300, 300]
    ids = [i for r in results for b in r[0] for i in b]
    assert sorted(ids) == list(range(100, 1000))        # the filter applied, every row once
    assert {len(r[0]) for r in results} == {19}          # 300 rows: 18 batches of 16 and one of 12
    assert all(r[1] and r[2] and r[3] for r in results)  # seeded, resumable, new order per epoch
    assert results[0][4] == (8,) and results[0][5] == ["100", "101"]
    assert results[0][6] == ["id", "x", "s"] and results[0][7] == 18
    assert "--data: 900 rows in 3 shards of 300 rows each, read directly from 3 Parquet files" \
        in capsys.readouterr().out


def test_shares_stream_the_same_number_of_batches_and_resume_anywhere(spark, table_dir):
    from hvd_magic.data.frames import data_plan
    from hvd_magic.rank import stream

    plan = data_plan(spark.read.parquet(table_dir).where("id < 998"), 4, lambda df: df,
                     local=True, cache=None)
    assert plan["counts"] == [249, 250, 249, 250] and plan["row_groups"] > 4
    for drop_last, batches, last in ((False, 16, 10), (True, 15, 16)):
        shares = [stream.Share(plan, r) for r in range(4)]
        epochs = [[b.column("id").to_pylist() for b in share.batches(
            16, epoch=2, seed=7, drop_last=drop_last, window=2)] for share in shares]
        assert [len(e) for e in epochs] == [batches] * 4    # every rank as many batches
        assert {len(e[-1]) for e in epochs} == {last}       # and the same last batch
        for share, epoch in zip(shares, epochs):
            rows = [i for b in epoch for i in b]
            if not drop_last:  # every row of the share, one repeated where it is one short
                assert set(rows) == set(share.table().column("id").to_pylist())
            assert [b.column("id").to_pylist() for b in share.batches(
                16, epoch=2, seed=7, drop_last=drop_last, window=2, start_batch=7)] == epoch[7:]
    share = stream.Share(plan, 0)
    first = [b.column("id").to_pylist() for b in share.batches(16, epoch=0, seed=7)]
    assert first != [b.column("id").to_pylist() for b in share.batches(16, epoch=1, seed=7)]
    assert first == [b.column("id").to_pylist() for b in share.batches(16, epoch=0, seed=7)]
    with pytest.raises(ValueError, match="start_batch must be a whole number"):
        next(share.batches(16, start_batch=-1))


def test_other_dataframes_are_converted_once_and_never_served_stale(ip, spark, tmp_path,
                                                                    capsys):
    from pyspark.sql import functions as F

    from hvd_magic.data import cache as datacache
    from hvd_magic.data.frames import data_plan

    source, cache = str(tmp_path / "src"), str(tmp_path / "cache")
    spark.range(0, 100, 1, 2).write.parquet(source)

    def plan():
        df = spark.read.parquet(source).withColumn("y", F.col("id") * 2)  # computed: converted
        return data_plan(df, 2, lambda df: df, local=True, cache=cache)

    first = plan()
    assert first["source"].startswith("converted once (it computes columns)")
    assert plan()["source"].startswith("reused") and plan()["files"] == first["files"]
    [(entry, mb, files, _)] = datacache.entries(cache)
    assert mb > 0 and files == len(first["files"])
    os.unlink(stream_path(first["files"][0]))               # a file of the entry deleted
    assert plan()["source"].startswith("converted once")
    spark.range(0, 50, 1, 1).write.mode("overwrite").parquet(source)  # the input rewritten
    again = plan()
    assert again["source"].startswith("converted once") and sum(again["counts"]) == 50
    assert len(datacache.entries(cache)) == 2                # the old input's entry is kept
    ip.run_line_magic("config", f"HorovodMagics.data_cache = {cache!r}")
    try:
        ip.run_line_magic("horovod_data", "")
        assert "2 converted DataFrames in" in capsys.readouterr().out
        ip.run_line_magic("horovod_data", "clear")
        assert "removed 2 entries" in capsys.readouterr().out and datacache.entries(cache) == []
    finally:
        ip.run_line_magic("config", "HorovodMagics.data_cache = ''")
    with pytest.raises(UsageError, match="Set one: %config HorovodMagics.data_cache"):
        datacache.cache_dir(None, local=False)


KEY_SCRIPT = """\
import sys
from pyspark.sql import SparkSession, functions as F
from hvd_magic.data import cache as datacache
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
def frame(sep):
    df = spark.read.option("header", "true").option("sep", sep).csv(sys.argv[1])
    return df.withColumn("c", F.length(df.columns[0]) * 2).filter("c > 1")
udf = frame(",").withColumn("d", F.udf(lambda v: v)("c"))
keys = [datacache.key(frame(",")), datacache.key(frame(";"))]
spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")  # a cast's zone: not in the plan's text
keys.append(datacache.key(frame(",")))
print(*keys, datacache._stable_plan(frame(",")) is not None, datacache._stable_plan(udf) is None)
spark.stop()
"""


def test_a_converted_dataframe_keys_the_same_in_another_kernel(tmp_path):
    """The entry's name comes from the plan's text, not from `semanticHash` (which differs per
    JVM): a new kernel reuses it; a scan read with other options, or a session in another time
    zone, never does; a UDF (its text shows a name, not the function) keys as before."""
    import subprocess
    import sys

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "part.csv").write_text("a,b\n1,2\n3,4\n")
    env = {**os.environ, "HVD_MAGIC_DATA_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", KEY_SCRIPT, str(tmp_path / "src")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(2)]
    (comma, semicolon, tokyo, stable, udf_falls_back), (comma_again, *_) = [
        p.communicate(timeout=300)[0].split() for p in procs]
    assert comma == comma_again and len({comma, semicolon, tokyo}) == 3
    assert stable == "True" and udf_falls_back == "True"


def stream_path(uri):
    from hvd_magic.rank.stream import local_path
    return local_path(uri)


def test_unreadable_files_are_told_before_any_rank_starts(spark, tmp_path):
    from hvd_magic.data.frames import data_plan

    from hvd_magic.rank.stream import Share

    path = str(tmp_path / "t")
    spark.range(0, 10, 1, 2).write.parquet(path)
    df = spark.read.parquet(path)
    plan = data_plan(df, 2, lambda df: df, local=True, cache=None)
    victim = sorted(f for f in os.listdir(path) if f.endswith(".parquet"))[0]
    with open(os.path.join(path, victim), "wb") as f:
        f.write(b"not parquet at all")
    with pytest.raises(UsageError, match=f"cannot read .*{victim}.*check that the file exists"):
        data_plan(df, 2, lambda df: df, local=True, cache=None)
    # a rank given the plan before the file changed refuses to read other rows than planned
    with pytest.raises(RuntimeError, match=f"{victim} was rewritten after this cell's shards"):
        Share(plan, 0).table()


def test_data_in_a_warm_session_per_cell(ip, fresh_ns, spark, table_dir):
    fresh_ns["df"] = spark.read.parquet(table_dir).select("id")
    fresh_ns["evens"] = spark.range(0, 40, 2, 2)
    ip.run_line_magic("horovod_session", "start --np 2")
    try:
        cell = "import hvd_magic\nhvd_magic.shard().num_rows"
        assert ip.run_cell_magic("horovod", "--data df --text", cell) == 500
        assert hvd_magic.last_run().results == [500, 500]
        assert ip.run_cell_magic("horovod", "--text", cell) == 500     # kept for later cells
        ip.run_cell_magic("horovod", "--data evens --text",
                          "sorted(hvd_magic.shard().column('id').to_pylist())")
        assert [i for r in hvd_magic.last_run().results for i in r] == list(range(0, 40, 2))
        ip.run_cell_magic("horovod", "--text", "t = hvd_magic.shard()")
        # the same DataFrame again (its conversion reused): what the ranks read of it is kept
        assert ip.run_cell_magic("horovod", "--data evens --text", "hvd_magic.shard() is t")
    finally:
        ip.run_line_magic("horovod_session", "stop")


def test_describe_says_what_each_rank_gets():
    from hvd_magic.data.plan import describe, equalize

    plan = {"counts": [5, 5], "source": "read directly from 1 Parquet file"}
    assert describe(plan) == ("--data: 10 rows in 2 shards of 5 rows each, read directly from 1 "
                              "Parquet file")
    uneven = dict(plan, counts=[4, 5])
    assert "of 4 to 5 rows, read directly" in describe(uneven)
    assert "repeat a row in their last batch" in describe(uneven)
    assert "--equal-shards dropped 1 of 9 rows" in describe(equalize(uneven), 9)


def test_batches_of_a_table_in_a_seeded_order():
    import numpy as np
    import pyarrow as pa

    table = pa.table({"a": np.arange(9, dtype=np.float32), "b": np.arange(9) * 10,
                      "v": pa.array([[i, i] for i in range(9)], pa.list_(pa.float32()))})

    def epoch(e, seed=0):
        return [b.tolist() for b in hvd_magic.numpy_batches(4, "a", epoch=e, seed=seed,
                                                              table=table)]

    assert sorted(x for b in epoch(0) for x in b) == list(range(9))   # every row once
    assert [len(b) for b in epoch(0)] == [4, 4, 1]
    assert epoch(0) == epoch(0) and epoch(0) != epoch(1) and epoch(0) != epoch(0, seed=1)
    drop = list(hvd_magic.numpy_batches(4, "a", drop_last=True, table=table))
    assert [len(b) for b in drop] == [4, 4]
    x, y = next(hvd_magic.torch_batches(3, (["a", "v"], "b"), shuffle=False, table=table))
    assert x.shape == (3, 3) and y.tolist() == [0, 10, 20]
    with pytest.raises(KeyError, match="no column 'c'"):
        next(hvd_magic.numpy_batches(3, "c", table=table))
    with pytest.raises(RuntimeError, match="started without a DataFrame"):
        hvd_magic.shard()


def test_a_dataframe_of_a_stopped_session_is_refused(ip, fresh_ns, spark):
    """Last in this module: it stops the shared session (the next run starts another)."""
    old = spark.range(10)
    spark.stop()
    embedded_session(4)
    fresh_ns["df"] = old
    with pytest.raises(UsageError, match="belongs to another SparkSession"):
        ip.run_cell_magic("horovod", "--np 4 --data df --text", "1")
