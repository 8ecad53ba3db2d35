"""Issue 7: where ranks run. A standalone worker that dies mid-run, and ranks on another host.

"Another host" is a Spark worker in a network namespace (tests/simhosts.py: the root namespace
and one namespace on a bridge, on a private /24 no interface uses yet): its executor, the ranks it
starts, their Gloo interface and the rendezvous server all see a machine of their own, reached
over the bridge. The master, the driver, the event channel and the other worker stay in the root
namespace, on the bridge's address. Everything made here is removed at the end, also on failure.
"""

import contextlib
import os
import signal
import time

import psutil
import pytest

import hvd_magic
import simhosts
from conftest import StandaloneCluster, ancestry

LONG_CELL = """\
import time, torch, horovod.torch as hvd, hvd_magic
hvd.init()
for step in range(100000):
    hvd.allreduce(torch.ones(4), name="loop")
    hvd_magic.report(step=step + 1)
    time.sleep(0.1)
"""


def rank_processes_left(pids, grace=15):
    """Recorded rank PIDs still running after `grace` s of waiting for them to go."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=grace)
    return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def under(pid, ancestor):
    """True when process `pid` runs under process `ancestor` (`conftest.ancestry`)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return ancestor in ancestry(pid)
    return False


# --- a worker killed mid-run ---------------------------------------------------------------------

@pytest.fixture
def doomed_cluster(tmp_path):
    cluster = StandaloneCluster(str(tmp_path)).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_worker_killed_mid_run_ends_the_run_clearly(ip, doomed_cluster):
    doomed_cluster.session()
    run = ip.run_cell_magic("horovod", "--np 4 --quiet --background", LONG_CELL)
    while not all(r.step for r in run.ranks):  # every rank is past hvd.init() and stepping
        assert run.state == "running", run.error
        run._done.wait(0.2)
    victim = doomed_cluster.workers[1]
    lost = [r for r in run.ranks if under(r.pid, victim.pid)]
    assert len(lost) == 2, [(r.rank, r.executor) for r in run.ranks]
    pids = [r.pid for r in run.ranks]
    os.killpg(victim.pid, signal.SIGKILL)  # the worker and its executor JVM

    with pytest.raises((hvd_magic.LaunchError, hvd_magic.RankError)) as info:
        run.wait(timeout=60)  # a TimeoutError here: the run did not notice in time
    text = str(info.value)
    named = [r for r in lost if f"rank {r.rank}" in text]
    assert named, text                          # a rank of the dead executor is named ...
    assert any(r.executor in text or r.host in text for r in named), text  # ... and where it was
    assert "at org.apache" not in text and "Py4J" not in text, text
    assert run.state == "failed"
    assert rank_processes_left(pids) == []


# --- ranks on another host: a worker in a network namespace --------------------------------------

TWO_HOSTS_CELL = """\
import os, torch, horovod.torch as hvd, torch.distributed as dist
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
dist.init_process_group("gloo")  # torch.distributed across the hosts too
ddp_total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(ddp_total)
(total.item(), hvd.cross_size(), hvd.local_size(), os.environ["HOROVOD_HOSTNAME"],
 os.environ["HOROVOD_GLOO_IFACE"], os.readlink("/proc/self/ns/net"), ddp_total.item(),
 (hvd.local_rank(), hvd.cross_rank()), tuple(int(os.environ[name]) for name in
 ("LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE")))
"""


def _link_bytes(name):
    stats = f"/sys/class/net/{name}/statistics"
    with open(f"{stats}/rx_bytes") as rx, open(f"{stats}/tx_bytes") as tx:
        return int(rx.read()) + int(tx.read())


LIGHTNING_FIT = """\
model = Tiny()
trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2, max_epochs=1,
                    enable_checkpointing=False, logger=False, enable_model_summary=False,
                    enable_progress_bar=False)
trainer.fit(model, data)
(os.environ["HOROVOD_HOSTNAME"], trainer.node_rank, trainer.local_rank, trainer.world_size,
 model.layer.weight.detach().tolist())
"""


@pytest.fixture
def two_hosts():
    """The root namespace and a network namespace on one bridge (tests/simhosts.py)."""
    why = simhosts.unavailable()
    if why:
        pytest.skip(why)
    with simhosts.simulated_hosts(2) as hosts:
        yield hosts


@pytest.fixture
def two_host_cluster(tmp_path, two_hosts):
    root, other = two_hosts
    cluster = StandaloneCluster(str(tmp_path), worker_hosts=(root.address, other.address),
                                master_host=root.address, worker_prefixes={1: other.prefix}).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_ranks_on_two_hosts_across_a_bridge(ip, two_hosts, two_host_cluster):
    root, other = two_hosts
    here, there = root.address, other.address
    session = two_host_cluster.session()
    before = _link_bytes(root.iface)
    try:
        ip.run_cell_magic("horovod", "--np 4 --quiet", TWO_HOSTS_CELL)
    except hvd_magic.RankError as exc:
        if "connect [127." in str(exc):  # this machine's hostname resolves to 127.0.0.1
            pytest.fail("Horovod's process-set Gloo context bound to the hostname's loopback "
                        "address: this venv's Horovod lacks hvd_magic/horovod_build/patches/"
                        "horovod-0.28.1-process-set-iface.patch (run `make setup`, or "
                        f"`python -m hvd_magic.build_horovod`).\n{exc}")
        raise
    run = hvd_magic.last_run()
    assert run.where == f"spark://{here}:{two_host_cluster.port}"
    by_host, groups = {}, {}
    for total, cross_size, local_size, host, iface, net, ddp_total, horovods, torchruns in \
            run.results:
        assert (total, cross_size, local_size, ddp_total) == (10.0, 2, 2, 10.0)
        by_host.setdefault(host, set()).add((iface, net))
        # torchrun's LOCAL_RANK and GROUP_RANK (the host's index) are Horovod's local and
        # cross ranks; two ranks on each of the two hosts
        assert torchruns[:2] == horovods and torchruns[2:] == (2, 2)
        groups.setdefault(host, set()).add(torchruns[1])
    # two ranks in each namespace, each using its own interface for Gloo (the bridge, the veth)
    assert by_host == {here: {(root.iface, root.netns_id())},
                       there: {(other.iface, other.netns_id())}}
    assert sorted(groups.values()) == [{0}, {1}]
    assert sorted(r.executor.rsplit(":", 1)[0] for r in run.ranks) == [here] * 2 + [there] * 2
    assert _link_bytes(root.iface) - before > 100_000  # the run's traffic went through the bridge

    # %horovod_env reaches the executor in the namespace too, and explains the hostname trap
    report = ip.run_line_magic("horovod_env", "")
    assert sorted(r.where.rsplit(":", 1)[0] for r in report.executors) == [here, there]
    assert not report.mismatches, report.text()
    if report.executors[0].values["hostname_address"].startswith("127."):
        assert "hostname resolves to 127." in report.text()

    # Lightning's Trainer on the same four ranks: two nodes of two devices, as the hosts are
    from test_lightning import MODULE
    ip.run_cell_magic("horovod", "--np 4 --quiet", MODULE + LIGHTNING_FIT)
    results, nodes = hvd_magic.last_run().results, {}
    for host, node_rank, local_rank, world, weights in results:
        assert world == 4 and weights == results[0][4]  # DDP averaged every rank's gradients
        nodes.setdefault(host, set()).add((node_rank, local_rank))
    assert nodes.keys() == {here, there}
    assert sorted(nodes.values(), key=min) == [{(0, 0), (0, 1)}, {(1, 0), (1, 1)}]
    session.stop()


CUT_AT_INIT_CELL = """\
import os, time, torch, horovod.torch as hvd
open(os.path.join({folder!r}, "ready-" + os.environ["HOROVOD_RANK"]), "w").close()
while not os.path.exists(os.path.join({folder!r}, "cut")):  # hvd.init() once the hosts are apart
    time.sleep(0.05)
hvd.init()
hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
"""


def test_a_network_cut_for_seconds_during_hvd_init_aborts_no_rank(ip, tmp_path, two_hosts,
                                                                  two_host_cluster):
    """The two hosts cut apart (the other host's cable: its veth's bridge end down) for 12 s
    while every rank calls hvd.init(): the ranks on the host without the rendezvous server
    cannot reach it until the cut heals. Horovod as published tries 3 times (each failing once
    ARP gives up) and aborts them (std::terminate, SIGABRT); with
    horovod-0.28.1-rendezvous-retry.patch they retry for HOROVOD_GLOO_TIMEOUT_SECONDS."""
    two_host_cluster.session()
    run = ip.run_cell_magic("horovod", "--np 4 --quiet --background",
                            CUT_AT_INIT_CELL.format(folder=str(tmp_path)))
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 4:
        assert run.state == "running" and time.monotonic() < deadline, run.error
        time.sleep(0.05)
    cable = f"hvr{os.getpid()}x1"  # (tests/simhosts.py's name for host 1's veth, bridge end)
    simhosts.ip("link", "set", cable, "down")
    try:
        (tmp_path / "cut").touch()
        time.sleep(12)
    finally:
        simhosts.ip("link", "set", cable, "up")
    assert run.wait(120) == [4.0] * 4
