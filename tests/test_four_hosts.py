"""Issue 29: real Horovod across four hosts: a standalone worker on each of four simulated hosts.

The hosts are the root network namespace and three namespaces on one bridge (tests/simhosts.py);
each host's worker has 2 cores, so ``--np 8`` puts two ranks on every host. What Horovod is told
(local rank and size, cross rank and size) has to match where each rank really runs, a collective
has to go across all of them, and a large value has to reach each host once: one Spark broadcast
file per executor, not one per rank.
"""

import glob
import os

import pytest

import hvd_magic
import simhosts
from conftest import StandaloneCluster

HOSTS, SLOTS = 4, 2
NP = HOSTS * SLOTS
BIG = 1 << 20  # float64s: 8 MiB pickled, above the 4 MiB broadcast threshold (driver/run.py)

CELL = """\
import os, torch, horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
(hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(), total.item(),
 os.environ["HOROVOD_HOSTNAME"], os.readlink("/proc/self/ns/net"), float(big[-1]), len(big))
"""


@pytest.fixture
def four_hosts():
    why = simhosts.unavailable()
    if why:
        pytest.skip(why)
    with simhosts.simulated_hosts(HOSTS) as hosts:
        yield hosts


@pytest.fixture
def cluster(tmp_path, four_hosts):
    local = [str(tmp_path / f"local{i}") for i in range(HOSTS)]  # each worker's spark.local.dir
    cluster = StandaloneCluster(
        str(tmp_path), worker_hosts=[h.address for h in four_hosts], cores=SLOTS,
        master_host=four_hosts[0].address,
        worker_envs={i: {"SPARK_LOCAL_DIRS": d} for i, d in enumerate(local)},
        worker_prefixes={i: h.prefix for i, h in enumerate(four_hosts) if h.netns}).start()
    cluster.local_dirs = local
    try:
        yield cluster
    finally:
        cluster.stop()


def broadcast_files(folder, at_least):
    """The files PySpark's broadcasts left in an executor's local dirs, `at_least` bytes big."""
    paths = glob.glob(os.path.join(folder, "**", "broadcast*"), recursive=True)
    return [p for p in paths if os.path.isfile(p) and os.path.getsize(p) >= at_least]


def test_np8_on_four_hosts_local_and_cross_ranks_one_copy_per_host(ip, fresh_ns, four_hosts,
                                                                    cluster):
    cluster.session()
    fresh_ns["big"] = __import__("numpy").arange(BIG, dtype="float64")
    ip.run_cell_magic("horovod", f"--np {NP} --quiet", CELL)
    run = hvd_magic.last_run()
    assert run.broadcast_names == ["big"]
    netns = {h.address: h.netns_id() for h in four_hosts}

    assert [r[0] for r in run.results] == list(range(NP))
    by_host = {}
    for rank, local_rank, local_size, cross_rank, cross_size, total, host, net, last, n in \
            run.results:
        assert (local_size, cross_size, total) == (SLOTS, HOSTS, NP * (NP + 1) / 2), rank
        assert (last, n) == (BIG - 1.0, BIG), rank   # the value itself, whole
        assert net == netns[host], (rank, host)     # the rank runs where Horovod was told it does
        by_host.setdefault(host, []).append((local_rank, cross_rank))
    assert sorted(by_host) == sorted(netns)
    for host, slots in by_host.items():
        assert sorted(local for local, _ in slots) == list(range(SLOTS)), host
        assert len({cross for _, cross in slots}) == 1, host  # one cross rank per host ...
    assert sorted(slots[0][1] for slots in by_host.values()) == list(range(HOSTS))  # ... all differ
    for r in run.ranks:  # the driver's record of where each rank ran agrees
        assert r.executor.rsplit(":", 1)[0] == run.results[r.rank][6]

    # one broadcast file per host (its executor's), though two ranks of each read it
    copies = [len(broadcast_files(d, BIG * 8)) for d in cluster.local_dirs]
    assert copies == [1] * HOSTS, copies
