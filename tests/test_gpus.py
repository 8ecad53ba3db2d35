"""Issues 7 and 63: every rank of a host sees the host's GPUs and finds its own at its local
rank (`hvd_magic.task.gpus`), on the driver and on Spark; NCCL on a shared GPU is refused.

This machine has no GPU: the standalone workers advertise named ones through a discovery script,
and what is checked is what a rank would hand to CUDA (its CUDA_VISIBLE_DEVICES, its local
ranks, the pinning it queued for when CUDA starts, Lightning's device) and what the driver
records (`run.ranks[i].gpus`, the dashboard's device column). CPU torch ignores all of it.
"""

import os
import stat
import subprocess
import time

import pytest

from IPython.core.error import UsageError

import hvd_magic
from conftest import StandaloneCluster
from hvd_magic.task.gpus import layout as gpu_layout, spark_ids, spark_ids_once, task_gpus


@pytest.mark.parametrize("addresses, visible, expected", [
    (["1"], None, ["1"]),                 # the executor sees every GPU: ids as Spark gave them
    (["0", "1"], "", ["0", "1"]),
    (["0"], "2,3", ["2"]),                # places in the executor's own visible list
    (["1", "0"], "6,7", ["7", "6"]),
    (["3"], "2,3", ["3"]),                # already one of the visible ids
    (["0", "1"], "2,0", ["2", "0"]),      # one is an id there too, the other is not: places
    (["2", "0"], "2,0", ["2", "0"]),      # both are ids there: ids
    (["GPU-a1b2"], "GPU-a1b2,GPU-c3d4", ["GPU-a1b2"]),  # UUIDs are ids, never places
    (["1"], "GPU-a1b2,GPU-c3d4", ["GPU-c3d4"]),         # a place in a list of UUIDs
    (["MIG-5e6f", "GPU-a1b2"], None, ["MIG-5e6f", "GPU-a1b2"]),  # MIG devices kept as named
    ([" 1 "], None, ["1"]),
    ([], "0,1", []),                      # no GPU for this task: nothing to set
])
def test_spark_addresses_read_as_the_ids_cuda_visible_devices_takes(addresses, visible, expected):
    assert list(spark_ids(addresses, visible).values()) == expected


@pytest.mark.parametrize("addresses", [[["0"], ["1"]], [["2"], ["0"]]], ids=["places", "ids"])
def test_an_executors_tasks_read_sparks_addresses_one_way_never_two_on_one_gpu(addresses):
    """An executor that sees GPUs 2 and 0 (its CUDA_VISIBLE_DEVICES=2,0), two tasks on it, one
    GPU each. Spark names them by place (0, 1) or by id (2, 0); read task by task, the first
    task's "0" is an id there, the second's "1" a place (GPU 0): both ranks on GPU 0. Read once
    for the executor, the two tasks are on GPUs 2 and 0 either way; a task of another executor
    (no list of its own) keeps its id."""
    said = {0: {"spark": addresses[0], "visible": "2,0"}, 1: {"spark": ["3"], "visible": None},
            2: {"spark": addresses[1], "visible": "2,0"}}
    own = task_gpus(said, {0: "executor-1", 1: "executor-2", 2: "executor-1"})
    assert sorted(own[0] + own[2]) == ["0", "2"] and own[1] == ["3"]


def test_an_elastic_runs_slots_on_one_executor_keep_its_first_reading(tmp_path):
    """An elastic run's slots come one at a time, each with its own address alone: slot "0"
    alone reads as an id of the list 2,0; slot "1" alone as a place (GPU 0). The executor's
    first reading stands for its later slots (kept in its own folder)."""
    (tmp_path / "executor-1").mkdir(), (tmp_path / "executor-2").mkdir()
    first = spark_ids_once(["1"], "2,0", str(tmp_path / "executor-1"))
    second = spark_ids_once(["0"], "2,0", str(tmp_path / "executor-1"))
    assert (first, second) == ({"1": "0"}, {"0": "2"})
    # alone, on an executor of its own, "0" is an id: GPU 0, the first slot's
    assert spark_ids_once(["0"], "2,0", str(tmp_path / "executor-2")) == {"0": "0"}
    assert os.listdir(tmp_path / "executor-1") == ["hvd_magic-gpu-addresses"]


@pytest.mark.parametrize("own, ranks, rank, visible, indices, shared", [
    # one GPU a rank: the host's list in local-rank order, each rank's own at its local rank
    ({0: ["3"], 1: ["1"], 2: ["0"]}, [0, 1, 2], 1, ("3", "1", "0"), (1,), ()),
    # two a rank: every rank's first GPU at its local rank, its second local_size further
    ({4: ["0", "1"], 5: ["2", "3"]}, [4, 5], 5, ("0", "2", "1", "3"), (1, 3), ()),
    # more ranks than GPUs: one entry a GPU, the ranks on it named to each other
    ({0: ["4"], 1: ["6"], 2: ["4"]}, [0, 1, 2], 2, ("4", "6"), (0,), ((0, "4"),)),
    ({0: [], 1: []}, [0, 1], 0, (), (), ()),  # no GPUs: nothing to see
])
def test_a_hosts_ranks_see_one_list_and_find_their_own_gpu_at_their_local_rank(
        own, ranks, rank, visible, indices, shared):
    layout = gpu_layout(own, ranks, rank)
    assert (layout.visible, layout.indices, layout.shared_with) == (visible, indices, shared)


def test_the_own_view_shows_a_rank_its_own_gpus_alone_as_cuda_0():
    layout = gpu_layout({0: ["0", "1"], 1: ["2", "3"]}, [0, 1], 1)
    assert layout.env() == {"CUDA_VISIBLE_DEVICES": "0,2,1,3", "HVD_MAGIC_GPUS": "1,3"}
    assert layout.env("own") == {"CUDA_VISIBLE_DEVICES": "2,3", "HVD_MAGIC_GPUS": "0,1",
                                 "LOCAL_RANK": "0"}


# What a cell on a GPU machine would pin, read on this one (no GPU, CPU torch). Lightning's own
# choice of device is its strategy's root device, accelerate's its state's device; CUDA is faked
# in the cell to reach them (the edge this machine lacks), after the rank queued its own pinning
# for when CUDA starts. accelerate (1.16) asks torch's accelerator API which device the machine
# has (`torch.accelerator.current_accelerator()`: None on CPU torch, whatever torch.cuda says, so
# its state's device is the CPU, index None); on a GPU machine it says cuda, accelerate's
# distributed type is MULTI_GPU whichever backend the group uses (NCCL there, Gloo here: CPU torch
# has no NCCL; the backend does not choose the device), and its device is
# cuda:(LOCAL_RANK % device_count): the rank's own, at its local rank. So torch's accelerator is
# faked too, as CUDA torch on a GPU machine answers.
PINNING_CELL = """import os, psutil, torch
import horovod.torch as hvd
hvd.init()
queued = [call.args[1] for call, _ in torch.cuda._queued_calls
          if getattr(getattr(call, "func", None), "__name__", "") == "_set_device"]
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
import lightning.pytorch as pl
trainer = pl.Trainer(accelerator="gpu", strategy="ddp", logger=False, enable_checkpointing=False)
torch.cuda.set_device = lambda device: None
torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cuda")
from accelerate import PartialState  # (Gloo: this machine's torch has no NCCL)
accelerate_device = PartialState(backend="gloo").device
forked = "hvd_magic.template.server" in " ".join(psutil.Process().parent().cmdline())
{"visible": os.environ["CUDA_VISIBLE_DEVICES"], "own": os.environ["HVD_MAGIC_GPUS"],
 "LOCAL_RANK": int(os.environ["LOCAL_RANK"]), "hvd": hvd.local_rank(), "queued": queued,
 "lightning": trainer.strategy.root_device.index, "accelerate": accelerate_device.index,
 "forked": forked,
 "cuda_started": torch.cuda.is_initialized()}
"""


def machine(r):
    """The host of a rank's executor (the tests' workers share one host name), or "driver"."""
    return r.executor.rsplit(":", 1)[0]


def assert_pinned_on_own_gpus(run, expected_visible):
    """Every rank's local rank, Horovod's, Lightning's device and the queued pinning all point at
    the rank's own GPU, at its place in the host's list; no two ranks of a host on one GPU."""
    by_host = {}
    for r, value in zip(run.ranks, run.results):
        lr = r.local_rank
        assert value["visible"] == expected_visible[machine(r)], (r.rank, value)
        assert int(value["own"].split(",")[0]) == lr, (r.rank, value)
        assert (value["LOCAL_RANK"], value["hvd"], value["lightning"], value["accelerate"]) == \
            (lr, lr, lr, lr), value
        assert value["queued"] == [lr] and not value["cuda_started"], value
        assert value["visible"].split(",")[lr] == r.gpus[0]     # what the dashboard names
        assert r.gpu_index[0] == lr
        by_host.setdefault(machine(r), []).append(r.gpus[0])
    for gpus in by_host.values():
        assert len(set(gpus)) == len(gpus), by_host


def test_driver_only_ranks_see_every_gpu_and_pin_their_own_by_local_rank(ip, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.delenv("HVD_MAGIC_FRESH", raising=False)  # forked ranks: the default
    ip.run_cell_magic("horovod", "--np -4 --quiet", PINNING_CELL)
    run = hvd_magic.last_run()
    assert [r.gpus for r in run.ranks] == [["4"], ["5"], ["6"], ["7"]]
    assert_pinned_on_own_gpus(run, {"driver": "4,5,6,7"})
    assert all(value["forked"] for value in run.results)  # pinned after the fork, not before
    from hvd_magic.view.table import _device
    assert _device(run.ranks[2].gpus, None, run.ranks[2].gpu_index) == "GPU 6 (cuda:2)"


NCCL_CELL = """import torch, torch.distributed as dist
torch.cuda.is_available = lambda: True  # (this machine has no GPU: what torch would see)
dist.init_process_group({backend})
dist.get_world_size()
"""

LIGHTNING_NCCL_CELL = """import torch, lightning.pytorch as pl
torch.cuda.is_available = lambda: True  # (this machine has no GPU: what torch would see)
torch.cuda.device_count = lambda: 3     # (a device a rank: Lightning's own demand)
trainer = pl.Trainer(accelerator="gpu", devices=3, strategy="ddp", logger=False,
                     enable_checkpointing=False)
trainer.strategy.setup_distributed()    # (fit's first step: no model can reach a fake GPU)
"""


@pytest.mark.parametrize("cell", [NCCL_CELL.format(backend=""), NCCL_CELL.format(backend="'nccl'"),
                                  LIGHTNING_NCCL_CELL], ids=["default", "nccl", "lightning"])
def test_nccl_on_a_gpu_two_ranks_share_is_refused_from_the_backend_chosen(ip, monkeypatch, cell):
    """Three driver-only ranks for two GPUs: ranks 0 and 2 share GPU 4. NCCL, asked for or
    chosen by torch (no backend on a GPU machine) or by Lightning, would fail minutes later
    inside init; the rank says why at once. Gloo shares the GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("distributed", "--np -3 --quiet", cell)
    text = "\n".join(info.value._render_traceback_())
    assert info.value.rank in (0, 2)
    other = 2 - info.value.rank
    assert (f"NCCL cannot put two ranks on one GPU, and rank {info.value.rank} shares GPU 4 "
            f"with rank {other} (this host's GPUs: 4,6)") in text
    assert "--np -2" in text and 'init_process_group("gloo")' in text


def test_ranks_share_gpus_over_gloo(ip, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert ip.run_cell_magic("distributed", "--np -3 --quiet",
                             NCCL_CELL.format(backend="'gloo'")) == 3
    run = hvd_magic.last_run()
    assert [r.gpus for r in run.ranks] == [["4"], ["6"], ["4"]]  # three ranks, two GPUs
    assert [r.gpu_index for r in run.ranks] == [[0], [1], [0]]


def test_the_own_view_is_refused_unless_it_is_own_or_shared(ip):
    with pytest.raises(UsageError, match="HVD_MAGIC_GPU_VIEW=mine: use 'own'"):
        ip.run_cell_magic("distributed", "--np -2 --quiet --env HVD_MAGIC_GPU_VIEW=mine", "1")


def test_the_own_view_shows_tensorflow_a_ranks_own_gpu_alone(ip, monkeypatch):
    """``--env HVD_MAGIC_GPU_VIEW=own``: CUDA_VISIBLE_DEVICES is the rank's own GPU alone, set
    before the rank's interpreter starts (TensorFlow reads it once), and torch's LOCAL_RANK is
    0, as under torchrun's --virtual-local-rank."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    ip.run_cell_magic("horovod", "--np -2 --quiet --env HVD_MAGIC_GPU_VIEW=own",
                      "import os\nimport tensorflow as tf\n"
                      "(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['LOCAL_RANK'], "
                      "len(tf.config.list_physical_devices('GPU')))")
    assert hvd_magic.last_run().results == [("4", "0", 0), ("6", "0", 0)]


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    """Two workers on their own addresses, four GPUs each by their discovery script; the second
    worker's executors see GPUs 4-7 alone (their own CUDA_VISIBLE_DEVICES), which Spark names
    0-3 there."""
    tmp = tmp_path_factory.mktemp("gpu-cluster")
    script = tmp / "discover-gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1", "2", "3"]}\'\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    cluster = StandaloneCluster(str(tmp), worker_envs={1: {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}},
                                worker_opts=("-Dspark.worker.resource.gpu.amount=4 "
                                             f"-Dspark.worker.resource.gpu.discoveryScript={script}"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def gpu_session(cluster, per_task):
    return cluster.session(**{"spark.executor.resource.gpu.amount": "4",
                              "spark.task.resource.gpu.amount": str(per_task)})


def run_on_gpus(ip, cluster, per_task, line, cell):
    """The run of `cell` on `cluster`, `per_task` GPUs a task (a session of its own)."""
    session = gpu_session(cluster, per_task)
    try:
        ip.run_cell_magic(line.split()[0], " ".join(line.split()[1:]), cell)
    finally:
        session.stop()
    return hvd_magic.last_run()


ENV_CELL = "import os\ntuple(os.environ[name] for name in {names!r})"


def by_executor(run):
    """Each executor's ranks' own GPUs."""
    gpus = {}
    for r in run.ranks:
        gpus.setdefault(r.executor, set()).update(r.gpus)
    return sorted(gpus.values(), key=min)


def test_spark_ranks_see_their_hosts_gpus_and_pin_their_own(ip, gpu_cluster):
    """Four tasks, two an executor, both executors on one host (the tests' workers share an
    address as the tasks know it): one list of the four GPUs Spark assigned, on every rank."""
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # executors see every GPU: ids pass as they are
    run = run_on_gpus(ip, gpu_cluster, 1, "horovod --np 4 --quiet", PINNING_CELL)
    assert run.where == gpu_cluster.url
    ranks = sorted(run.ranks, key=lambda r: r.local_rank)
    assert_pinned_on_own_gpus(run, {"127.0.0.1": ",".join(r.gpus[0] for r in ranks)})
    mine, its_own = by_executor(run)  # the second's GPUs mapped through its CUDA_VISIBLE_DEVICES
    assert len(mine) == len(its_own) == 2 and mine <= set("0123") and its_own <= set("4567")
    from hvd_magic.view.dashboard import Dashboard
    dashboard = Dashboard()
    dashboard.start(run)  # (a finished foreground run: nothing is displayed)
    table = dashboard._table_html(run)
    for r in run.ranks:
        row = table.split(f"<tr data-rank='{r.rank}'")[1].split("</tr>")[0]
        assert f"GPU {r.gpus[0]} (cuda:{r.local_rank})</td>" in row


def test_spark_ranks_with_two_gpus_each_find_their_first_at_their_local_rank(ip, gpu_cluster):
    run = run_on_gpus(ip, gpu_cluster, 2, "distributed --np 4 --quiet", ENV_CELL.format(
        names=("CUDA_VISIBLE_DEVICES", "HVD_MAGIC_GPUS", "LOCAL_RANK")))
    assert len({visible for visible, _, _ in run.results}) == 1  # one list on the host
    visible = run.results[0][0].split(",")
    for r, (_, own, local_rank) in zip(run.ranks, run.results):
        local_rank = int(local_rank)
        assert local_rank == r.local_rank and len(r.gpus) == 2
        assert own == f"{local_rank},{local_rank + 4}"  # its first, then a local size further
        assert [visible[int(i)] for i in own.split(",")] == r.gpus
    assert sorted(visible) == list("01234567")
    mine, its_own = by_executor(run)
    assert mine == set("0123") and its_own == set("4567")


def test_tensorflow_imported_on_a_rank_sees_its_own_gpu_alone(monkeypatch):
    """What `hvd_magic.rank.gpus` does once a rank imports TensorFlow, on a TensorFlow that sees
    three GPUs (faked: this machine has none): its visible GPUs narrowed to the rank's own, before
    TensorFlow's runtime starts; one that cannot narrow any more (its runtime started) is left."""
    import types
    from hvd_magic.rank import gpus

    class Config:
        def __init__(self, started=False):
            self.visible, self.started = None, started

        def list_physical_devices(self, kind):
            return [f"/physical_device:{kind}:{i}" for i in range(3)]

        def set_visible_devices(self, devices, kind):
            if self.started:
                raise RuntimeError("Visible devices cannot be modified after being initialized")
            self.visible = (devices, kind)

    monkeypatch.setenv("HVD_MAGIC_GPUS", "1")
    tf = types.SimpleNamespace(config=Config())
    gpus._pin_tensorflow(tf)
    assert tf.config.visible == (["/physical_device:GPU:1"], "GPU")
    started = types.SimpleNamespace(config=Config(started=True))
    gpus._pin_tensorflow(started)  # (as it is: the cell's own pinning, if any, stands)
    assert started.config.visible is None


# The GPU edge of a machine of two GPUs and a MIG device, as NVML and CUDA's driver say it (this
# machine has none): NVML numbers by PCI bus, GPU_A first; CUDA orders fastest first, GPU_B first.
GPU_A, GPU_B = "GPU-" + "-".join(c * n for c, n in zip("aaaaa", (8, 4, 4, 4, 12))), \
    "GPU-" + "-".join(c * n for c, n in zip("bbbbb", (8, 4, 4, 4, 12)))
MIG_C = "MIG-" + "-".join(c * n for c, n in zip("ccccc", (8, 4, 4, 4, 12)))
FAKE_NVML = r"""
/* GPU_A: 1 GiB used, GPU_B: 2 GiB, the MIG device 3 GiB (no utilisation: NVML has none for MIG) */
#include <string.h>
typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned int gpu, memory; } rates_t;
static const char *uuids[] = {"%s", "%s", "%s"};
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    if (i >= 2) return 2;
    *h = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    for (long i = 0; i < 3; i++) if (!strcmp(uuid, uuids[i])) { *h = (void *)(i + 1); return 0; }
    return 6; }
int nvmlDeviceGetMemoryInfo(void *h, memory_t *m) {
    m->total = 16ULL << 30; m->used = (long)h << 30; m->free = m->total - m->used; return 0; }
int nvmlDeviceGetUtilizationRates(void *h, rates_t *r) {
    if ((long)h == 3) return 3;
    r->gpu = 80 + (long)h; r->memory = 40; return 0; }
""" % (GPU_A, GPU_B, MIG_C)
FAKE_CUDA = r"""
/* CUDA's order: GPU_B, then GPU_A; a process sees the ones its CUDA_VISIBLE_DEVICES numbers */
#include <stdlib.h>
#include <string.h>
static int seen[2] = {0, 1}, count = 2;
int cuInit(unsigned int flags) {
    const char *p = getenv("CUDA_VISIBLE_DEVICES");
    if (p == NULL) return 0;
    for (count = 0; *p && count < 2; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
        seen[count++] = atoi(p);
    return 0; }
int cuDeviceGetCount(int *n) { *n = count; return 0; }
int cuDeviceGet(int *device, int ordinal) {
    if (ordinal >= count) return 101;
    *device = seen[ordinal]; return 0; }
int cuDeviceGetUuid(unsigned char *uuid, int device) {
    memset(uuid, device ? 0xaa : 0xbb, 16); return 0; }
"""


@pytest.fixture
def gpu_edge(tmp_path, monkeypatch):
    """NVML and CUDA's driver of the machine above, for every process started from here on."""
    for name, source, variable in (("libnvidia-ml.so.1", FAKE_NVML, "HVD_MAGIC_NVML"),
                                   ("libcuda.so.1", FAKE_CUDA, "HVD_MAGIC_LIBCUDA")):
        (tmp_path / f"{name}.c").write_text(source)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / name),
                        str(tmp_path / f"{name}.c")], check=True)
        monkeypatch.setenv(variable, str(tmp_path / name))


def test_the_sampler_finds_a_ranks_gpu_in_nvml_by_uuid_not_by_cudas_number(gpu_edge, monkeypatch):
    """CUDA's GPU 0 is NVML's 1 (fastest first, against PCI order): the sampler reads the GPU the
    rank uses (its UUID from CUDA's driver, seeing every GPU whatever the task's own list), and a
    UUID or a MIG device as named."""
    from hvd_magic.task.nvml import Nvml
    from hvd_magic.task.resources import Sampler

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # (the task's own list: not the machine's)
    sample = Sampler(os.getpid(), None, gpus=["0", "1", GPU_A, MIG_C]).sample(Nvml())
    assert sample["gpus"] == [
        {"index": 0, "util": 82, "mem": 2 << 30, "mem_total": 16 << 30},   # GPU_B
        {"index": 1, "util": 81, "mem": 1 << 30, "mem_total": 16 << 30},   # GPU_A
        {"index": GPU_A, "util": 81, "mem": 1 << 30, "mem_total": 16 << 30},
        {"index": MIG_C, "util": None, "mem": 3 << 30, "mem_total": 16 << 30}]


def test_uuid_and_mig_ids_are_kept_from_the_notebook_to_each_ranks_sampler(ip, gpu_edge,
                                                                           monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{GPU_B},{MIG_C}")
    marker = str(tmp_path / "go")
    run = ip.run_cell_magic("distributed", "--np -2 --background --quiet",
                            f"import os, time\nwhile not os.path.exists({marker!r}):\n"
                            "    time.sleep(0.05)\n"
                            "(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['HVD_MAGIC_GPUS'])")
    try:
        deadline = time.monotonic() + 60
        while not all((r.usage.latest or {}).get("gpus") for r in run.ranks):
            assert time.monotonic() < deadline and run.state == "running", run.error
            time.sleep(0.1)
        assert [r.usage.latest["gpus"][0]["mem"] for r in run.ranks] == [2 << 30, 3 << 30]
    finally:
        open(marker, "w").close()
    assert run.wait(60) == [(f"{GPU_B},{MIG_C}", "0"), (f"{GPU_B},{MIG_C}", "1")]
    assert [r.gpus for r in run.ranks] == [[GPU_B], [MIG_C]]
    from hvd_magic.view.table import _device
    assert _device(run.ranks[1].gpus, None, run.ranks[1].gpu_index) == f"GPU {MIG_C} (cuda:1)"
    assert {"rank", f"gpu{MIG_C}_mem"} <= set(run.resources.columns)


def test_spark_ranks_given_half_a_gpu_each_share_one_by_design(ip, gpu_cluster):
    """``spark.task.resource.gpu.amount=0.5``: Spark puts two tasks on each GPU, by design (it
    counts a GPU as two slots); each pair of ranks is told it shares its GPU, and with whom (so
    NCCL on it is refused: test above), and sees it once in its host's list."""
    run = run_on_gpus(ip, gpu_cluster, 0.5, "distributed --np 4 --quiet", ENV_CELL.format(
        names=("CUDA_VISIBLE_DEVICES", "HVD_MAGIC_GPUS", "HVD_MAGIC_GPU_SHARED_WITH")))
    on = {}
    for r, (visible, own, shared) in zip(run.ranks, run.results):
        assert len(r.gpus) == 1 and visible.split(",")[int(own)] == r.gpus[0]
        on.setdefault(r.gpus[0], []).append(r)
        partner, gpu = shared.split(":")
        assert gpu == r.gpus[0] and int(partner) != r.rank
    assert sorted(len(ranks) for ranks in on.values()) == [2, 2]  # two GPUs, two ranks each
    for ranks in on.values():
        assert len({r.executor for r in ranks}) == 1  # (the tasks of one executor)


ELASTIC_GPU_CELL = """import os
import horovod.torch as hvd
hvd.init()
(os.environ["CUDA_VISIBLE_DEVICES"], os.environ["HVD_MAGIC_GPUS"])
"""


def test_an_elastic_spark_run_gets_each_rank_its_own_gpu(ip, gpu_cluster):
    """Four slots, two an executor (one task a slot: no siblings to read Spark's addresses
    with): the second executor's addresses 0-3 are places in its own list 4,5,6,7, so no rank of
    its shares a GPU with the first executor's (ids 0-3) on the one host."""
    run = run_on_gpus(ip, gpu_cluster, 1, "horovod --np 4 --min-np 4 --quiet", ELASTIC_GPU_CELL)
    assert run.state == "done", run.error
    gpus = [r.gpus[0] for r in run.ranks]
    assert all(len(r.gpus) == 1 for r in run.ranks) and len(set(gpus)) == 4, gpus
    for r, (visible, own) in zip(run.ranks, run.results):
        assert (visible, own) == (r.gpus[0], "0")  # its own alone, as cuda:0 (docs/gpus.md)
    # two slots an executor (two cores each): the second's mapped through its list
    assert sorted(g in "4567" for g in gpus) == [False, False, True, True], gpus
