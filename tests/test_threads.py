"""CPU threads per rank (hvd_magic/task/threads.py): every rank gets its share of its host's
cores in OMP_NUM_THREADS and the other libraries' variables, and torch sizes its pool by it: on
the driver, on Spark (over PySpark's own OMP_NUM_THREADS), in a warm session and an elastic
run; an explicit --env wins. Real rank processes; the expected share is computed from this
machine's cores."""

import os
import subprocess
import sys

import pytest

import hvd_magic
from hvd_magic.launch.spark import embedded_session
from hvd_magic.task import threads

from conftest import _stop_spark, spark_session

CORES = len(os.sched_getaffinity(0))
# torch (through MKL) never takes more threads than the cores it finds: its own default here
TORCH_MAX = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                               capture_output=True, text=True, check=True,
                               env={k: v for k, v in os.environ.items()
                                    if k not in threads.THREAD_VARS}).stdout)

# What a rank sees: its variables, and the pool torch made from them.
PROBE = """\
import os
import torch
{name: os.environ.get(name) for name in %r} | {"torch": torch.get_num_threads()}
""" % (threads.THREAD_VARS,)


def probe(together=False):
    """The same as a function (nested: cloudpickle sends it by value, not as this module's);
    `together`: the ranks first meet in hvd.init(), so none ends before every rank started."""
    def probe():
        import os
        import torch
        from hvd_magic.task.threads import THREAD_VARS
        if together:
            import horovod.torch as hvd
            hvd.init()
        return {name: os.environ.get(name) for name in THREAD_VARS} | \
            {"torch": torch.get_num_threads()}
    return probe


def share(ranks):
    return max(1, CORES // ranks)


def assert_share(seen, count):
    for rank, values in enumerate(seen):
        assert values["torch"] == min(count, TORCH_MAX), (rank, values)
        assert {values[name] for name in threads.THREAD_VARS} == {str(count)}, (rank, values)


def test_driver_ranks_share_the_cores(ip, capsys):
    ip.run_cell_magic("horovod", "--np -2", PROBE)
    assert_share(hvd_magic.last_run().results, share(2))
    # the text view's per-host line says it
    expected = f"2 ranks, {share(2)} CPU thread{'s' if share(2) > 1 else ''} per rank"
    assert expected in capsys.readouterr().out
    assert [r.threads for r in hvd_magic.last_run().ranks] == [str(share(2))] * 2


def test_an_explicit_env_wins(ip):
    ip.run_cell_magic("horovod", "--np -2 --env OMP_NUM_THREADS=3", PROBE)
    assert_share(hvd_magic.last_run().results, 3)  # every library's, as OMP_NUM_THREADS says
    seen = ip.run_cell_magic("horovod", "--np -1 --env MKL_NUM_THREADS=5", PROBE)
    assert seen["MKL_NUM_THREADS"] == "5" and seen["OMP_NUM_THREADS"] == str(share(1))


def test_spark_ranks_share_the_cores_over_pysparks_setting():
    # PySpark's workers set OMP_NUM_THREADS=spark.task.cpus, 1 by default: 2 ranks' share on 2
    # cores too. Tasks of more cpus than the host has cores tell the two apart at any np;
    # local[2 * cpus] holds 2 such tasks, and its cores do not bound the share.
    cpus = CORES + 1
    spark_session(2)  # the JVM up first (a JVM keeps its launch's settings for later sessions)
    _stop_spark()
    embedded_session(2, conf={"spark.task.cpus": str(cpus)}, master=f"local[{2 * cpus}]")
    try:
        for np in (1, 2):
            run = hvd_magic.run(probe(), np=np)
            assert run.where == f"local[{2 * cpus}]"
            assert_share(run.results, share(np))
    finally:
        _stop_spark()  # (later tests' sessions: spark.task.cpus 1)


def test_a_warm_sessions_ranks_share_the_cores(ip):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        ip.run_cell_magic("horovod", "", PROBE)
        assert_share(hvd_magic.last_run().results, share(2))
    finally:
        ip.run_line_magic("horovod_session", "stop")


@pytest.mark.parametrize("np", [-2, 2])
def test_an_elastic_runs_ranks_share_the_cores(np):
    # Horovod's elastic driver gives each worker a host of its own (local size 1): the share
    # counts the slots on this machine (on Spark, the slots' tasks on this host). Both ranks
    # start together (min_np: np) and meet in hvd.init(): with fewer required, or a rank done
    # before the other's worker started (a loaded host), a rank alone rightly takes every core.
    if np > 0:
        spark_session(max(np, CORES))
    run = hvd_magic.run(probe(together=True), np=np, min_np=abs(np))
    assert len(run.results) == abs(np)
    assert_share(run.results, share(abs(np)))


def test_the_share():
    assert threads.rank_threads(2, cores=2) == 1
    assert threads.rank_threads(4, cores=2) == 1          # never 0
    assert threads.rank_threads(1, cores=16) == 16
    # an executor of 4 cores on a 16-core host: its 2 ranks get 2 each, not 8
    assert threads.rank_threads(2, executor_cores=4, ranks_on_executor=2, cores=16) == 2
    # two such executors on the host, 2 ranks each: the executor's cores bound them
    assert threads.rank_threads(4, executor_cores=4, ranks_on_executor=2, cores=16) == 2
    # local[4] on 2 cores: the host's cores bound them
    assert threads.rank_threads(2, executor_cores=4, cores=2) == 1
    assert threads.usable_cores() <= CORES


def test_an_executors_cores_from_the_sessions_settings():
    conf = {"spark.executor.cores": "6"}.get
    assert threads.executor_cores("local[4]", conf) == 4      # local: the master says
    assert threads.executor_cores("local", conf) == 1
    assert threads.executor_cores("local[*]", conf) is None   # the machine's
    assert threads.executor_cores("local-cluster[2, 3, 1024]", conf) == 3
    assert threads.executor_cores("spark://h:7077", conf) == 6
    assert threads.executor_cores("spark://h:7077", {}.get) is None  # a worker's cores, all
    assert threads.executor_cores("yarn", {}.get) == 1
