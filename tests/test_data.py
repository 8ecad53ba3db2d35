"""``--data df``: DataFrame shards made by Spark on the executors, read on the ranks with
`hvd_magic.shard()`; --equal-shards; every bad --data gets its message. Real Spark (the embedded
local session), real ranks."""

import os

import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic.task.shard import shards_message
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
    assert "--data: 1,001 rows in 4 shards of" in out.err


def test_equal_shards_even_the_ranks_and_say_what_was_dropped(ip, fresh_ns, spark, capsys):
    # 4 partitions of 10, 10, 10 and 13 rows: the stage runs over them as they are
    fresh_ns["df"] = spark.range(0, 43, 1, 4)
    cell = "import hvd_magic\nhvd_magic.shard().num_rows"
    ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
    assert sorted(hvd_magic.last_run().results) == [10, 11, 11, 11]
    ip.run_cell_magic("horovod", "--np 4 --data df --equal-shards --text", cell)
    assert hvd_magic.last_run().results == [10, 10, 10, 10]
    out = capsys.readouterr().err
    assert "--equal-shards gives every rank the same number" in out
    assert "4 shards of 10 rows each (--equal-shards dropped 3 of 43 rows)" in out


def test_an_empty_shard_stops_the_run_with_a_message(ip, fresh_ns, spark):
    # 4 partitions (so no repartition), one of which the filter leaves empty
    ids = [row.id for row in spark.range(0, 12, 1, 4).rdd.glom().collect()[2]]
    fresh_ns["df"] = spark.range(0, 12, 1, 4).where(f"id not in ({', '.join(map(str, ids))})")
    with pytest.raises(UsageError, match=r"rank 2's shard is empty .*Use fewer ranks"):
        ip.run_cell_magic("horovod", "--np 4 --data df --text", "import hvd_magic\nhvd_magic.shard()")


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
    with pytest.raises(UsageError, match=r"--data needs Spark .*use --np 2 instead of --np -2"):
        ip.run_cell_magic("horovod", "--np -2 --data frame", "1")
    with pytest.raises(UsageError, match="data= needs Spark"):
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


def test_shard_messages():
    assert shards_message([5, 5], False) == "--data: 10 rows in 2 shards of 5 rows"
    assert "of 4 to 6 rows (--equal-shards" in shards_message([4, 6], False)
    assert "--equal-shards dropped 2 of 10 rows" in shards_message([4, 6], True)
    assert "rank 1's shard is empty" in shards_message([3, 0], False)


def test_batches_cover_the_shard_once_per_epoch_in_a_seeded_order(tmp_path, monkeypatch):
    import numpy as np
    import pyarrow as pa

    table = pa.table({"a": np.arange(10, dtype=np.float32), "b": np.arange(10) * 10,
                      "v": pa.array([[i, i] for i in range(10)], pa.list_(pa.float32()))})
    path = tmp_path / "shard.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    monkeypatch.setenv("HVD_MAGIC_SHARD", str(path))
    (tmp_path / "shard.rows").write_text("9")        # --equal-shards kept 9 of 10 rows
    monkeypatch.setenv("HVD_MAGIC_SHARD_READY", str(tmp_path / "shard.rows"))
    shard = hvd_magic.shard()
    assert shard.num_rows == 9 and hvd_magic.shard() is shard

    def epoch(e, seed=0):
        return [b.tolist() for b in hvd_magic.numpy_batches(4, "a", epoch=e, seed=seed)]

    assert sorted(x for b in epoch(0) for x in b) == list(range(9))   # every row once
    assert [len(b) for b in epoch(0)] == [4, 4, 1]
    assert epoch(0) == epoch(0) and epoch(0) != epoch(1) and epoch(0) != epoch(0, seed=1)
    drop = list(hvd_magic.numpy_batches(4, "a", drop_last=True))
    assert [len(b) for b in drop] == [4, 4]
    x, y = next(hvd_magic.torch_batches(3, (["a", "v"], "b"), shuffle=False))
    assert x.shape == (3, 3) and y.tolist() == [0, 10, 20]
    with pytest.raises(KeyError, match="no column 'c'"):
        next(hvd_magic.numpy_batches(3, "c"))
    monkeypatch.delenv("HVD_MAGIC_SHARD")
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
    os.environ.pop("HVD_MAGIC_SHARD", None)
