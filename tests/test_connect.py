"""The same cells through a Spark Connect session: a real Connect server (started from the pyspark
wheel's jars, local[4]) and this process as its client, with no SparkContext of its own."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import hvd_magic
from conftest import ALLREDUCE_CELL, _stop_spark, logged
from hvd_magic.errors import RankError


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    import pyspark

    _stop_spark()  # this process is a pure Connect client from here on
    home = os.path.dirname(pyspark.__file__)
    log = str(tmp_path_factory.mktemp("connect") / "server.log")
    env = dict(os.environ, SPARK_HOME=home, PYSPARK_PYTHON=sys.executable)
    # The server (and its executors) run where the tests' folders are an empty tmpfs: what the
    # ranks import of a notebook's own module is only what hvd_magic shipped with the job.
    hide = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs none {tmp_path_factory.getbasetemp()} && exec "$@"', "hide"]
    proc = subprocess.Popen(
        hide + [os.path.join(home, "bin", "spark-submit"), "--class",
         "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[4]",
         "--conf", "spark.connect.grpc.binding.port=0", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        port = int(logged(log, r"Spark Connect server started at: \S+:(\d+)", proc,
                          "the Spark Connect server").group(1))
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        spark.test_url = f"sc://127.0.0.1:{port}"
        yield spark
        spark.stop()
    finally:
        # (the Connect builder leaves this set, and every later SparkSession.builder would
        # then make Connect sessions: later tests use classic ones)
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


@pytest.fixture(scope="module", autouse=True)
def _data_cache_both_sides_see():
    """The server cannot see the tests' folders (see `connect`): converted --data DataFrames go
    to a folder outside them."""
    shared = tempfile.mkdtemp(prefix="hvd_magic-connect-cache-")
    before = os.environ.get("HVD_MAGIC_DATA_CACHE")
    os.environ["HVD_MAGIC_DATA_CACHE"] = shared
    yield
    os.environ["HVD_MAGIC_DATA_CACHE"] = before or ""
    shutil.rmtree(shared, ignore_errors=True)


def test_a_cell_runs_through_the_active_connect_session(ip, connect):
    value = ip.run_cell_magic("horovod", "--np 2 --text", ALLREDUCE_CELL)
    run = hvd_magic.last_run()
    assert value == 3.0 and run.results == [3.0, 3.0]
    assert run.where.startswith("Spark Connect 127.0.0.1:") and "(local[4])" in run.where
    assert all("rank" in open(run.log_path(r)).read() for r in range(2))  # lines came live


def test_a_ddp_cell_through_connect(ip, connect):
    cell = ("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "x = torch.tensor([dist.get_rank() + 1.0])\ndist.all_reduce(x)\nx.item()")
    assert ip.run_cell_magic("distributed", "--np 2 --quiet", cell) == 3.0
    assert hvd_magic.last_run().results == [3.0, 3.0]


def test_a_tf_distribute_cell_through_connect(ip, connect):
    pytest.importorskip("tensorflow", reason="make setup installs TensorFlow")
    from test_tf_distribute import MIRRORED_FIT, assert_fitted_in_step
    ip.run_cell_magic("distributed", "--np 2 --quiet", MIRRORED_FIT)
    assert_fitted_in_step(hvd_magic.last_run().results, "tf_keras")


def test_a_notebook_module_travels_with_the_job(ip, connect, tmp_path, monkeypatch):
    (tmp_path / "connmod.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        ip.run_cell("import connmod").raise_error()
        ip.user_ns["here"] = str(tmp_path)
        # on the rank, the notebook's folder does not exist: connmod came with the job
        assert ip.run_cell_magic("horovod", "--np 2 --text",
                                 "import os\n(connmod.triple(7), os.path.isdir(here))") == (21, False)
    finally:
        sys.modules.pop("connmod", None)
        ip.user_ns.pop("connmod", None)
        ip.user_ns.pop("here", None)


def test_a_run_returns_once_its_results_are_released_on_the_server(connect, monkeypatch):
    """pyspark releases a read result from a thread pool; a `spark.stop()` right after the run
    would close the server's session before that call, and the server logs an ERROR with its
    Java stack (seen under load). Here every release is held back 1 s: the run waits for it."""
    from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as It

    pool, late = It._release_thread_pool.fget, []

    class Late:  # the release thread pool, each call a second late
        def __init__(self, it):
            self.pool = pool(it)

        def submit(self, fn):
            late.append(1)
            return self.pool.submit(lambda: (time.sleep(1), fn())[1])

    monkeypatch.setattr(It, "_release_thread_pool", property(Late))
    assert hvd_magic.run(lambda: 1, np=2).results == [1, 1]
    assert late, "no release was sent"
    assert all(f.done() for f in connect.client._release_futures)


def test_a_rank_error_comes_back_through_connect(ip, connect):
    with pytest.raises(RankError) as info:
        ip.run_cell_magic("horovod", "--np 2 --text",
                          "import horovod.torch as hvd\nhvd.init()\n"
                          "if hvd.rank() == 1:\n    raise KeyError('no such column')\n")
    assert "rank 1" in str(info.value) and "KeyError: 'no such column'" in str(info.value)


def test_data_shards_through_connect(ip, fresh_ns, connect, tmp_path, monkeypatch, capsys):
    from IPython.core.error import UsageError

    # the server cannot see the tests' folders (see `connect`): a cache there is refused
    monkeypatch.setenv("HVD_MAGIC_DATA_CACHE", str(tmp_path / "cache"))
    fresh_ns["df"] = connect.range(0, 1003, 1, 3).selectExpr("id", "id * 2.0 as x")
    cell = "import hvd_magic\nt = hvd_magic.shard()\n(t.num_rows, t.column('id').to_pylist())"
    with pytest.raises(UsageError, match="the executors cannot write where this machine reads"):
        ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
    shared = tempfile.mkdtemp(prefix="hvd_magic-connect-")  # a folder both sides see
    try:
        monkeypatch.setenv("HVD_MAGIC_DATA_CACHE", shared)
        _data_through_connect(ip, fresh_ns, connect, shared, cell, capsys)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _data_through_connect(ip, fresh_ns, connect, shared, cell, capsys):
    ip.run_cell_magic("horovod", "--np 4 --data df --equal-shards --text", cell)
    run = hvd_magic.last_run()
    counts = {n for n, _ in run.results}
    assert counts == {250} and run.shards == [250] * 4
    ids = [i for _, chunk in run.results for i in chunk]
    assert len(set(ids)) == 1000 and set(ids) <= set(range(1003))
    connect.range(0, 100, 1, 2).write.parquet(shared + "/t")  # read directly: no Spark job
    fresh_ns["df"] = connect.read.parquet(shared + "/t").select("id")
    ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
    assert sorted(i for _, chunk in hvd_magic.last_run().results for i in chunk) == list(range(100))
    out = capsys.readouterr().out
    assert "(--equal-shards dropped 3 of 1,003 rows), converted once" in out
    assert "100 rows in 4 shards of 25 rows each, read directly from 2 Parquet files" in out


def test_a_large_value_and_result_are_chunked_under_the_grpc_limit(ip, fresh_ns, connect):
    import numpy as np

    fresh_ns["big"] = np.arange(3_000_000, dtype=np.float64)  # 24 MB each way
    value = ip.run_cell_magic("horovod", "--np 2 --text", "big * 2")
    assert value.shape == (3_000_000,) and value[-1] == 5_999_998.0


def test_executors_that_cannot_reach_the_notebook_still_run_the_cell(ip, connect, monkeypatch,
                                                                     capsys):
    # An address the executors cannot connect to (TEST-NET-1): the tasks find out within
    # seconds, run offline, and everything comes back through Spark at the end.
    monkeypatch.setenv("HVD_MAGIC_DRIVER_HOST", "192.0.2.1")
    value = ip.run_cell_magic("horovod", "--np 2 --text", ALLREDUCE_CELL)
    run = hvd_magic.last_run()
    assert value == 3.0 and run.results == [3.0, 3.0]
    assert "rank 1 of 2: 3.0" in open(run.log_path(1)).read()    # the log came back, all of it
    assert [r.state for r in run.ranks] == ["done", "done"]
    out = capsys.readouterr().out
    assert "not shown live: the Spark executors could not reach this notebook at 192.0.2.1:" in out
    with pytest.raises(RankError, match="ZeroDivisionError"):
        ip.run_cell_magic("horovod", "--np 2 --text", "1 / 0")
    # the tasks find an empty DataFrame among themselves; the driver says so at the end
    from IPython.core.error import UsageError
    ip.user_ns["tiny"] = connect.range(3)
    with pytest.raises(UsageError, match="has 3 rows, fewer than the 4 ranks"):
        ip.run_cell_magic("horovod", "--np 4 --data tiny --text", "1")
    from hvd_magic.errors import LaunchError
    with pytest.raises(LaunchError, match="a warm session needs its ranks to reach this notebook"):
        ip.run_line_magic("horovod_session", "start --np 2")


def test_cancel_interrupts_the_stage_of_tasks_that_cannot_hear_the_driver(connect, monkeypatch):
    """Offline tasks never get the driver's stop: Cancel interrupts their stage by its tag, and
    their ranks go with it."""
    import psutil

    from hvd_magic.errors import RunCancelled

    monkeypatch.setenv("HVD_MAGIC_DRIVER_HOST", "192.0.2.1")

    def sleepy():
        import time
        time.sleep(600)

    run = hvd_magic.run(sleepy, np=2, background=True, view=None)

    def ranks_alive():
        return [p for p in psutil.process_iter(["cmdline"])
                if any(f"hvd_magic-{run.id}-rank" in part for part in p.info["cmdline"] or ())]

    deadline = time.monotonic() + 60
    while len(ranks_alive()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(ranks_alive()) == 2
    run.cancel()
    with pytest.raises(RunCancelled):
        run.wait(60)
    deadline = time.monotonic() + 30
    while ranks_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ranks_alive() == []


def test_horovod_runner_through_connect(connect):
    from hvd_magic import HorovodRunner

    def train(scale):
        import horovod.torch as hvd
        import torch
        hvd.init()
        return hvd.allreduce(torch.tensor([scale * (hvd.rank() + 1)]), op=hvd.Sum).item()

    assert HorovodRunner(np=2).run(train, scale=2.0) == 6.0


def test_a_dataframe_of_another_session_is_refused(ip, fresh_ns, connect):
    from IPython.core.error import UsageError
    from pyspark.sql import SparkSession

    other = SparkSession.builder.remote(connect.test_url).create()
    try:
        fresh_ns["df"] = other.range(10)
        with pytest.raises(UsageError, match="belongs to another SparkSession"):
            ip.run_cell_magic("horovod", "--np 2 --data df --text", "1")
    finally:
        other.stop()


def test_a_warm_session_and_horovod_env_through_connect(ip, connect):
    from IPython.core.error import UsageError

    ip.run_line_magic("horovod_session", "start --np 2")
    try:
        ip.run_cell_magic("horovod", "--text", "import horovod.torch as hvd\nhvd.init()\nw = hvd.rank() * 10")
        assert ip.run_cell_magic("horovod", "--text", "w + 1") == 1
        assert hvd_magic.last_run().results == [1, 11]
        with pytest.raises(UsageError, match="the notebook has no variable 'no_such_df'"):
            ip.run_cell_magic("horovod", "--data no_such_df", "1")
    finally:
        ip.run_line_magic("horovod_session", "stop")
    with pytest.raises(UsageError, match="needs a classic SparkSession"):
        ip.run_line_magic("horovod_env", "")
