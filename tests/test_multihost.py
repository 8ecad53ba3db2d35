"""Issue 7: where ranks run. A standalone worker that dies mid-run, and ranks on another host.

"Another host" is a Spark worker in a network namespace this test makes (``ip netns``), joined to
the root namespace by a veth pair on a private /24: its executor, the ranks it starts, their Gloo
interface and the rendezvous server all see a machine of their own, reached over the veth. The
master, the driver, the event channel and the other worker stay in the root namespace, on the
veth's address. Everything made here is removed at the end, also on failure.
"""

import contextlib
import os
import shutil
import signal
import subprocess

import psutil
import pytest

import hvd_magic
from conftest import StandaloneCluster

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
    """True when process `pid` descends from process `ancestor`."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
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
