"""Issue 7: each rank gets its own GPU, from Spark's resources or (driver-only) by local rank.

This machine has no GPU: the standalone workers advertise fake ones through a discovery script,
and what is checked is what a rank would hand to CUDA (its CUDA_VISIBLE_DEVICES) and what the
driver records (`run.ranks[i].gpus`, the dashboard's device column). CPU torch ignores both.
"""

import os
import stat

import pytest

from IPython.core.error import UsageError

import hvd_magic
from conftest import StandaloneCluster
from hvd_magic.task.plan import visible_devices

# The rank finds its executor itself, from the JVM it runs under (rank -> pyspark worker ->
# pyspark daemon -> CoarseGrainedExecutorBackend --executor-id N), not from hvd_magic's records.
GPU_CELL = """\
import os, psutil
import horovod.torch as hvd
hvd.init()
jvm = psutil.Process()
while "--executor-id" not in jvm.cmdline():
    args = jvm.cmdline()  # (a forked rank's parent: its host's template, which names its owner)
    jvm = (psutil.Process(int(args[args.index("hvd_magic.template.server") + 2]))
           if "hvd_magic.template.server" in args else jvm.parent())
args = jvm.cmdline()
(os.environ.get("CUDA_VISIBLE_DEVICES"), args[args.index("--executor-id") + 1])
"""


@pytest.mark.parametrize("assigned, visible, expected", [
    (["1"], None, ["1"]),                 # the executor sees every GPU: ids as Spark gave them
    (["0", "1"], "", ["0", "1"]),
    (["0"], "2,3", ["2"]),                # indices into the executor's own visible list
    (["1", "0"], "6,7", ["7", "6"]),
    (["3"], "2,3", ["3"]),                # already one of the visible ids
    (["GPU-a1b2"], "GPU-a1b2,GPU-c3d4", ["GPU-a1b2"]),  # UUIDs are ids, never indices
    ([" 1 "], None, ["1"]),
    ([], "0,1", []),                      # no GPU for this task: nothing to set
])
def test_visible_devices(assigned, visible, expected):
    assert visible_devices(assigned, visible) == expected


def test_driver_only_ranks_get_gpus_by_local_rank(ip, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    value = ip.run_cell_magic("horovod", "--np -3 --quiet",
                              "import os\nos.environ['CUDA_VISIBLE_DEVICES']")
    run = hvd_magic.last_run()
    assert value == "4"
    assert run.results == ["4", "6", "4"]  # three ranks, two GPUs: round robin
    assert [r.gpus for r in run.ranks] == [["4"], ["6"], ["4"]]


NCCL_CELL = """\
import torch.distributed as dist
dist.init_process_group({backend!r})
dist.get_world_size()
"""


def test_nccl_on_more_driver_only_ranks_than_gpus_is_refused_before_they_start(ip, monkeypatch):
    """NCCL puts one rank on a GPU: three ranks for two GPUs would meet minutes later inside
    init_process_group. Code that shares the GPUs over Gloo still runs, round robin."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    before = len(hvd_magic.runs())
    with pytest.raises(UsageError, match=r"NCCL.* has 2 GPUs for 3 ranks\. Run --np -2"):
        ip.run_cell_magic("distributed", "--np -3 --quiet", NCCL_CELL.format(backend="nccl"))
    assert len(hvd_magic.runs()) == before  # nothing started
    assert ip.run_cell_magic("distributed", "--np -3 --quiet",
                             NCCL_CELL.format(backend="gloo")) == 3


def test_tensorflow_on_a_rank_sees_only_that_ranks_gpu(ip, monkeypatch):
    """The same pinning reaches TensorFlow: CUDA_VISIBLE_DEVICES is set before the rank's
    interpreter starts, so TensorFlow's GPU list is the rank's GPU alone (none on this machine)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    ip.run_cell_magic("horovod", "--np -2 --quiet",
                      "import os\nimport tensorflow as tf\n"
                      "(os.environ['CUDA_VISIBLE_DEVICES'], len(tf.config.list_physical_devices('GPU')))")
    assert hvd_magic.last_run().results == [("4", 0), ("6", 0)]


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-cluster")
    script = tmp / "discover-gpus.sh"
    script.write_text("#!/bin/sh\necho '{\"name\": \"gpu\", \"addresses\": [\"0\", \"1\"]}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    cluster = StandaloneCluster(str(tmp), worker_opts=(
        f"-Dspark.worker.resource.gpu.amount=2 "
        f"-Dspark.worker.resource.gpu.discoveryScript={script}")).start()
    try:
        session = cluster.session(**{"spark.executor.resource.gpu.amount": "2",
                                     "spark.task.resource.gpu.amount": "1"})
        yield cluster
        session.stop()
    finally:
        cluster.stop()


def test_each_spark_rank_gets_its_own_gpu(ip, gpu_cluster):
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # executors see every GPU: ids pass as they are
    ip.run_cell_magic("horovod", "--np 4 --quiet", GPU_CELL)
    run = hvd_magic.last_run()
    results = run.results
    assert run.where == gpu_cluster.url
    pairs = [(executor, gpu) for gpu, executor in results]
    assert len(set(pairs)) == 4, pairs          # no GPU given to two ranks of one executor
    assert {gpu for _, gpu in pairs} == {"0", "1"}
    assert len({executor for executor, _ in pairs}) == 2
    # what the driver recorded (and shows) is what each rank got
    assert [r.gpus for r in run.ranks] == [[gpu] for gpu, _ in results]
    from hvd_magic.view.dashboard import Dashboard
    dashboard = Dashboard()
    dashboard.start(run)  # (a finished foreground run: nothing is displayed)
    table = dashboard._table_html(run)
    for r in run.ranks:
        row = table.split(f"<tr data-rank='{r.rank}'")[1].split("</tr>")[0]
        assert f"GPU {results[r.rank][0]}</td>" in row
