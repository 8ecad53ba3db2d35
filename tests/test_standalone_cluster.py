"""The same cell on a real Spark standalone cluster: one master, two workers, four ranks."""

import os
import signal
import subprocess
import sys

import pytest

import hvd_magic
from conftest import ALLREDUCE_CELL, ancestry, cancelled_if_running
from hvd_magic.view.text import TextView


def test_allreduce_on_two_workers(ip, standalone):
    session = standalone.session()
    try:
        cell = ALLREDUCE_CELL.replace(
            "total.item()\n",
            "import os\n(total.item(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),"
            " os.environ['HOROVOD_HOSTNAME'])\n")
        value = ip.run_cell_magic("horovod", "--np 4", cell)
        run = hvd_magic.last_run()
        assert run.where == standalone.url
        assert value[0] == 10.0
        assert [r[0] for r in run.results] == [10.0] * 4
        # ranks spread over both executors (workers on 127.0.0.1 and 127.0.0.2)
        executors = {r.executor for r in run.ranks}
        assert len(executors) == 2, executors
        # local ranks are numbered per host, as Horovod sees the hosts
        by_host = {}
        for total, local_rank, local_size, cross_rank, host in run.results:
            by_host.setdefault(host, []).append((local_rank, local_size))
        # (both workers are on this machine, and the driver sees both executors at 127.0.0.1:
        # one host to Horovod, local ranks 0..3 across the two executors)
        assert set(by_host) == {e.rsplit(":", 1)[0] for e in executors}
        for host, slots in by_host.items():
            assert sorted(s[0] for s in slots) == list(range(len(slots)))
            assert all(s[1] == len(slots) for s in slots)
    finally:
        session.stop()


def test_torchrun_variables_on_two_workers(ip, standalone):
    """torch.distributed across the two workers' executors: LOCAL_RANK and GROUP_RANK are
    Horovod's local and cross ranks (the hosts as the cluster knows them). Then --timeline: every
    rank's profile comes back from both hosts, each named by its host, each host's clock
    known."""
    from test_timeline_ranks import DDP_CELL

    from hvd_magic.timelines import ranks

    session = standalone.session()
    cell = ("import os, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "x = torch.ones(1)\ndist.all_reduce(x)\n"
            "(x.item(), os.environ['HOROVOD_HOSTNAME'], *(int(os.environ[k]) for k in (\n"
            "    'RANK', 'LOCAL_RANK', 'GROUP_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_WORLD_SIZE',\n"
            "    'HOROVOD_LOCAL_RANK', 'HOROVOD_CROSS_RANK', 'HOROVOD_LOCAL_SIZE',\n"
            "    'HOROVOD_CROSS_SIZE')))")
    try:
        ip.run_cell_magic("distributed", "--np 4 --quiet", cell)
        run = hvd_magic.last_run()
        assert len({r.executor for r in run.ranks}) == 2  # both workers
        # (rank 1 asleep 0.15 s a step: more than what the ranks' profilers' start and two
        # fresh clones side by side make a step of the others last, which 0.04 s was not)
        ip.run_cell_magic("distributed", "--np 4 --timeline-steps 3:5 --quiet",
                          DDP_CELL.replace("time.sleep(0.04)", "time.sleep(0.15)"))
        timed = hvd_magic.last_run()
        profiled = ranks.RanksTimeline.load(timed.timeline_path)
    finally:
        session.stop()
    assert [r["host"] for r in profiled.ranks] == [r.host for r in timed.ranks], \
        (profiled.ranks, [(r.host, r.executor) for r in timed.ranks])
    assert len({r.executor for r in timed.ranks}) == 2  # from both workers
    assert all(r["uncertainty_us"] is not None for r in profiled.ranks), profiled.ranks
    assert len(profiled.table()) == 12 and profiled.verdict().startswith("rank 1 arrived last")
    by_host = {}
    for rank, (total, host, rank_var, local, group, local_size, groups, *horovods) in \
            enumerate(run.results):
        assert (total, rank_var) == (4.0, rank)
        assert (local, group, local_size, groups) == tuple(horovods)
        by_host.setdefault(host, []).append(local)
    for locals_ in by_host.values():  # LOCAL_RANK counts the ranks of each host from 0
        assert sorted(locals_) == list(range(len(locals_)))


def test_data_shards_on_two_workers(ip, fresh_ns, standalone, tmp_path):
    from IPython.core.error import UsageError

    session = standalone.session()
    cell = ("import hvd_magic\nt = hvd_magic.shard()\n"
            "(t.column('id').to_pylist(), sum(t.column('x').to_pylist()))")
    try:
        fresh_ns["df"] = session.range(0, 2000, 1, 5).selectExpr("id", "id * 0.5 as x")
        # not plain Parquet: converted, into a folder a cluster must be told of
        with pytest.raises(UsageError, match="Set one: %config HorovodMagics.data_cache"):
            ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
        ip.run_line_magic("config", f"HorovodMagics.data_cache = {str(tmp_path / 'cache')!r}")
        ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
        run = hvd_magic.last_run()
        ids = [i for chunk, _ in run.results for i in chunk]
        assert sorted(ids) == list(range(2000))          # disjoint, and all of them
        assert sum(x for _, x in run.results) == sum(range(2000)) * 0.5
        assert len({r.executor for r in run.ranks}) == 2  # ranks on both workers read them
    finally:
        ip.run_line_magic("config", "HorovodMagics.data_cache = ''")
        session.stop()


def test_a_large_value_reaches_each_rank_from_its_executors_broadcast_file(ip, standalone):
    session = standalone.session()
    try:
        ip.run_cell("import numpy\nbig = numpy.arange(2_000_000, dtype=numpy.float64)").raise_error()
        value = ip.run_cell_magic("horovod", "--np 4 --quiet", "(float(big.sum()), big.shape)")
        run = hvd_magic.last_run()
        assert run.broadcast_names == ["big"]  # 16 MB: a Spark broadcast on a cluster
        assert type(run._shared["big"]).__name__ == "Broadcast"
        assert value == (2_000_000 * 1_999_999 / 2, (2_000_000,))
        assert run.results == [value] * 4
    finally:
        session.stop()


# Horovod's elastic API as a user writes it; the loop ends when the test says so, decided by
# every rank together at a commit (a collective), so that no rank stops a step before another.
ELASTIC_TRAINING = """\
import os
import time
import horovod.torch as hvd
import torch
import hvd_magic

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0, done=False)
starts = []

@hvd.elastic.run
def train(state):
    starts.append(state.step)
    while not state.done:
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        state.step += 1
        if state.step % 10 == 0:
            flag = torch.tensor([float(os.path.exists(stop_file))])
            state.done = bool(hvd.allreduce(flag, op=hvd.Max).item())
            state.commit()
        hvd_magic.report(step=state.step, size=hvd.size())
        time.sleep(0.05)

train(state)
{"step": state.step, "starts": starts, "size": hvd.size(),
 "weights": [p.detach().flatten().tolist() for p in model.parameters()]}
"""


def _waiter(run):
    """wait_for(predicate, what): until `predicate()`, failing if the run ends first."""
    import time

    def wait_for(predicate, what, timeout=180):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert run.state == "running", f"the run ended ({run.state}: {run.error}) before {what}"
            assert time.monotonic() < deadline, (
                f"timed out waiting for {what}; the ranks (rank, state, step, size): "
                f"{[(r.rank, r.state, r.step, r.metrics.get('size')) for r in run.ranks]}; "
                f"the membership: {run.membership}; their logs' ends: "
                f"{ {r.rank: run.folder.log_tail(r.rank) for r in run.ranks} }")
            time.sleep(0.1)
    return wait_for


def _ranks_under(pid, ranks):
    """The pids of those `ranks` (the run's) that run under process `pid` (`conftest.ancestry`)."""
    return {r.pid for r in ranks if pid in ancestry(r.pid)}


def _lose_worker_1_and_grow_back(run, standalone, stop_file, rings=False):
    """Worker 1 (its executor, its two ranks) SIGKILLed once every rank is at step 20, started
    again once the survivors trained on in a world of 2 (`rings`: after Horovod formed their
    ring), and the run told to end (`stop_file`) once all 4 train together again (after the ring
    of 4); (the ranks that were on worker 1, the step seen before the kill, the results)."""
    wait_for = _waiter(run)
    with cancelled_if_running(run):
        wait_for(lambda: all((r.step or 0) >= 20 for r in run.ranks), "every rank at step 20")
        on_worker_1 = [r.rank for r in run.ranks
                       if r.pid in _ranks_under(standalone.workers[1].pid, run.ranks)]
        assert len(on_worker_1) == 2, [(r.rank, r.pid) for r in run.ranks]
        seen = max(r.step for r in run.ranks)
        standalone.kill_worker(1)  # its executor, the Python workers and their ranks die with it
        survivors = [r for r in run.ranks if r.rank not in on_worker_1]
        if rings:
            wait_for(lambda: any(c["t"] == "ring" and c["size"] == 2 for c in run.membership),
                     "a ring of the 2 survivors")
            ring_2 = next(c["time"] for c in run.membership if c["t"] == "ring" and c["size"] == 2)
        wait_for(lambda: all(r.metrics.get("size") == 2 and (r.step or 0) >= seen + 20
                             for r in survivors), "the survivors to train on in a world of 2")
        standalone.restart_worker(1)
        if rings:
            wait_for(lambda: any(c["t"] == "ring" and c["size"] == 4 and c["time"] > ring_2
                                 for c in run.membership), "the ring to be 4 again")
        wait_for(lambda: all(r.metrics.get("size") == 4 for r in run.ranks),
                 "every rank to train in a world of 4 again")
        stop_file.write_text("")
        return on_worker_1, seen, run.wait(120)


def test_elastic_run_survives_a_lost_worker_and_grows_back(ip, fresh_ns, standalone, tmp_path):
    """--np 4 --min-np 2 on two workers of two slots: one worker (its executor, its ranks) is
    SIGKILLed mid-training; the two survivors go on from their last commit; the worker is
    started again, the lost slots' tasks run there again and the ring is 4 again."""
    session = standalone.session()
    stop_file = tmp_path / "stop"
    fresh_ns.update(stop_file=str(stop_file))
    # (the Gloo timeout is also how long the survivors' new ring waits for the replacements to
    # start: 12.7 s on the restarted worker under three suites' load, and at 10 s every rank
    # aborted; hvd_magic cuts the survivors' wait on the lost ranks itself)
    run = ip.run_cell_magic("horovod", "--np 4 --min-np 2 --background --quiet --env "
                                       "HOROVOD_GLOO_TIMEOUT_SECONDS=30", ELASTIC_TRAINING)

    try:
        on_worker_1, seen, results = _lose_worker_1_and_grow_back(run, standalone, stop_file,
                                                                  rings=True)
    finally:
        session.stop()

    assert run.state == "done", run.error
    assert len(results) == 4 and all(r["size"] == 4 for r in results)
    assert all(r["weights"] == results[0]["weights"] for r in results)
    assert len({r["step"] for r in results}) == 1
    # the survivors went back to a commit no earlier than the last one before the kill, never
    # further; the replacements started from a commit the survivors had made
    last_commit = seen // 10 * 10
    for r in results:
        assert all(s % 10 == 0 for s in r["starts"]) and r["starts"] == sorted(r["starts"])
    # membership: both slots of the lost worker lost, joined again, the ring 4 -> 2 -> 4.
    # Rarely, a survivor aborts in Gloo as its peers die (Horovod #2484: "terminate called after
    # throwing gloo::EnforceNotMet"): it is lost (SIGABRT) and replaced in its task
    lost = [c for c in run.membership if c["t"] == "lost"]
    also = [c for c in lost if c["rank"] not in on_worker_1]
    assert all(c["code"] == -signal.SIGABRT for c in also), also
    joined = {c["rank"] for c in run.membership if c["t"] == "joined"}
    assert {c["rank"] for c in lost} == joined and set(on_worker_1) <= joined
    sizes = [c["size"] for c in run.membership if c["t"] == "ring"]
    assert sizes[0] == 4 and 2 in sizes and sizes[-1] == 4, sizes
    for c in lost:
        if c["rank"] in on_worker_1:  # what the driver heard: the task's connection ended with it
            assert "the executor was lost" in c["how"] and c["key"].startswith(f"hvd-s{c['rank']}-")
    survivor_starts = [results[i]["starts"] for i in range(4) if i not in joined]
    assert survivor_starts and all(s[0] == 0 and s[1] >= last_commit for s in survivor_starts), \
        survivor_starts
    assert not run.unended()


ELASTIC_LOCAL_RANKS = """\
import os
import horovod.torch as hvd
hvd.init()
(os.environ.get("SPARK_LOCAL_IP"), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
 hvd.cross_size())
"""


def test_a_session_cell_whose_worker_is_lost_ends_naming_its_rank(ip, fresh_ns, standalone):
    """A warm session on the cluster; a worker is SIGKILLed while a cell runs (its executor,
    tasks and ranks die without a word): the cell ends naming a rank of that worker and its
    lost executor, and the session says it needs a restart. (It waited for its ranks forever:
    found by bench/chaos.py.)"""
    session = standalone.session()
    ip.run_line_magic("horovod_session", "start --np 4")
    try:
        run = ip.run_cell_magic("horovod", "--quiet --background", "import time\ntime.sleep(300)")
        on_worker_1 = _ranks_under(standalone.workers[1].pid, run.ranks)
        assert len(on_worker_1) == 2, [(r.rank, r.pid) for r in run.ranks]
        standalone.kill_worker(1)
        with pytest.raises(hvd_magic.RankError) as info:
            run.wait(120)
        text = str(info.value)
        assert any(f"rank {r.rank} " in text for r in run.ranks if r.pid in on_worker_1), text
        assert "its executor was lost" in text, text
        with pytest.raises(hvd_magic.LaunchError, match="%horovod_session restart"):
            ip.run_cell_magic("horovod", "--quiet", "1")
    finally:
        ip.run_line_magic("horovod_session", "stop")
        standalone.restart_worker(1)
        session.stop()


def test_elastic_ranks_have_local_ranks_per_worker_host(ip, standalone):
    """Horovod's elastic driver sees a host key per rank; the ranks are still told their local
    rank among the ranks of their own worker host (SPARK_LOCAL_IP: 127.0.0.1 and 127.0.0.2),
    and their cross rank among the hosts, as horovodrun gives them."""
    session = standalone.session()
    try:
        ip.run_cell_magic("horovod", "--np 4 --min-np 2 --quiet", ELASTIC_LOCAL_RANKS)
        results = hvd_magic.last_run().results
    finally:
        session.stop()
    by_host = {}
    for host, local_rank, local_size, cross_rank, cross_size in results:
        by_host.setdefault(host, []).append((local_rank, local_size, cross_rank, cross_size))
    assert sorted(by_host) == ["127.0.0.1", "127.0.0.2"], results
    for host, ranks in by_host.items():
        assert sorted(r[0] for r in ranks) == [0, 1] and all(r[1] == 2 for r in ranks), results
        assert all(r[3] == 2 for r in ranks), results
    for local_rank in (0, 1):  # a cross ring per local rank, one member on each host
        crosses = sorted(r[2] for ranks in by_host.values() for r in ranks if r[0] == local_rank)
        assert crosses == [0, 1], results


def test_stacks_of_ranks_on_the_clusters_executors(ip, standalone):
    """`run.stacks()` reaches ranks in the cluster's executors: rank 0 waits in an allreduce for
    rank 1, which sleeps in a function of its own."""
    import time

    session = standalone.session()
    cell = ("import time, torch, horovod.torch as hvd\nhvd.init()\n"
            "def load_batch(batch_id):\n    time.sleep(300)\n"
            "if hvd.rank() == 1:\n    load_batch(7)\nhvd.allreduce(torch.ones(2), name='grad')\n")
    run = ip.run_cell_magic("horovod", "--np 2 --background --quiet", cell)
    try:
        deadline = time.monotonic() + 180
        while True:  # the ranks start slowly
            stacks = run.stacks()
            text = stacks.text()
            if ("in load_batch" in text and "→ allreduce" in text) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert run.where == standalone.url
        assert "rank 0: Cell In[" in text and "→ allreduce" in text, text
        assert "rank 1: Cell In[" in text and "in load_batch" in text, text
        assert "load_batch" in stacks[1] and "allreduce" in stacks[0] and not stacks.missing
    finally:
        run.cancel()
        with pytest.raises(hvd_magic.RunCancelled):
            run.wait(60)
        session.stop()


def test_executors_without_horovod_run_ddp_and_say_what_horovod_needs(ip, standalone,
                                                                      env_without_horovod,
                                                                      monkeypatch):
    """A cluster whose executors run a user's own environment (the project's wheel, no Horovod)
    while the notebook has Horovod: a DDP cell runs there; a Horovod cell fails on its ranks
    with a message naming the executors' Python, not this notebook's."""
    # (session() sets PYSPARK_PYTHON for this process: put back after, or every later session
    # of this worker, a kernel's it starts too, would run that environment's Python)
    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
    session = standalone.session(python=env_without_horovod)
    try:
        ddp = ("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
               "x = torch.ones(1)\ndist.all_reduce(x)\nx.item()")
        assert ip.run_cell_magic("distributed", "--np 2 --quiet", ddp) == 2.0
        with pytest.raises(hvd_magic.RankError) as failed:
            ip.run_cell_magic("horovod", "--np 2 --quiet", ALLREDUCE_CELL)
    finally:
        session.stop()
    message = str(failed.value)
    assert "No module named 'horovod'" in message
    assert "needs Horovod, which is not installed in the Python of the executor on" in message
    assert f"({env_without_horovod})" in message
    assert "python -m hvd_magic.build_horovod" in message


# --- the notebook's environment on the cluster (hvd_magic.launch.shipping, task/shipped.py) ---

@pytest.fixture(scope="module")
def executors_lacking(tmp_path_factory):
    """Executors whose Python has torch and nothing else (no hvd_magic, cloudpickle, psutil,
    numpy, pyspark nor Horovod: Spark's own zips serve its Python workers): worker 0's has no
    `shiptest` either, worker 1's has shiptest 0.9 and fastlib 1.0 (a compiled one). The
    notebook gets shiptest 1.0 (a wheel pip built) and fastlib 2.0, built for a C library newer
    than any here, in a folder put on its path (as `%pip install` would).
    (the python executors run, the notebook's folder)"""
    from own_env import TORCH_ONLY, compiled_dist, install, make_env, small_wheel
    tmp = tmp_path_factory.mktemp("shipping")
    lacking = make_env(tmp / "lacking", None, keep=TORCH_ONLY)
    older = make_env(tmp / "older", None, keep=TORCH_ONLY)
    site = subprocess.run([older, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    install(site + "/", small_wheel(str(tmp), "shiptest", "0.9", 'VERSION = "0.9"\n'))
    compiled_dist(site, "fastlib", "1.0", "cp311-abi3-manylinux_2_17_x86_64")
    python = tmp / "python"
    python.write_text(f'#!/bin/sh\nif [ "$HVD_TEST_WORKER" = 1 ]; then exec {older} "$@"; fi\n'
                      f'exec {lacking} "$@"\n')
    python.chmod(0o755)
    notebook = str(tmp / "notebook-site") + "/"
    install(notebook, small_wheel(str(tmp), "shiptest", "1.0", 'VERSION = "1.0"\n'))
    compiled_dist(notebook, "fastlib", "2.0", "cp311-abi3-manylinux_2_99_x86_64")
    return str(python), notebook


@pytest.fixture
def on_lacking_executors(standalone, executors_lacking, monkeypatch):
    python, notebook = executors_lacking
    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
    monkeypatch.syspath_prepend(notebook)  # (and importlib's caches made again)
    session = standalone.session(python=python)
    yield session
    session.stop()


# The same loop with torch.distributed and hvd_magic.elastic (no Horovod on the ranks' side).
ELASTIC_DDP_TRAINING = """\
import os, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import hvd_magic
from hvd_magic import elastic

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.TorchState(model=model, optimizer=optimizer, step=0, done=False)

@elastic.run
def train(state):
    ddp = DDP(state.model)
    while not state.done:
        optimizer.zero_grad()
        ddp(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        state.step += 1
        if state.step % 10 == 0:
            flag = torch.tensor([float(os.path.exists(stop_file))])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            state.done = bool(flag.item())
            state.commit()
        hvd_magic.report(step=state.step, size=dist.get_world_size())
        time.sleep(0.05)

train(state)
{"step": state.step, "size": dist.get_world_size(),
 "weights": [p.detach().flatten().tolist() for p in model.parameters()]}
"""


def test_elastic_ddp_survives_a_lost_worker_and_grows_back(ip, fresh_ns, on_lacking_executors,
                                                          standalone, tmp_path):
    """--np 4 --min-np 2 of torch.distributed code (hvd_magic.elastic) on two workers of two
    slots: one worker is SIGKILLed mid-training; the two survivors go on in a world of 2; the
    worker is started again, the lost slots' tasks run there again and the world is 4 again.
    The executors lack hvd_magic and the cell's package (`executors_lacking`): the replacement
    executor gets them as the first did."""
    from hvd_magic.task.shipped import cache_root

    stop_file = tmp_path / "stop"
    fresh_ns.update(stop_file=str(stop_file))
    cell = ELASTIC_DDP_TRAINING.replace("import hvd_magic\n", "import hvd_magic, shiptest\n") \
        .replace('{"step": state.step,', '{"step": state.step, "shiptest": shiptest.VERSION, '
                 '"hvd_magic": hvd_magic.__file__,')
    run = ip.run_cell_magic("distributed", "--np 4 --min-np 2 --background --quiet", cell)

    on_worker_1, _, results = _lose_worker_1_and_grow_back(run, standalone, stop_file)

    assert run.state == "done", run.error
    assert len(results) == 4 and all(r["size"] == 4 for r in results)
    assert all(r["shiptest"] == "1.0" and r["hvd_magic"].startswith(cache_root())
               for r in results), results
    assert all(r["weights"] == results[0]["weights"] for r in results)
    assert len({r["step"] for r in results}) == 1
    lost = [c for c in run.membership if c["t"] == "lost"]
    assert sorted(c["rank"] for c in lost) == sorted(on_worker_1), lost
    assert all("the executor was lost" in c["how"] for c in lost), lost
    assert {c["rank"] for c in run.membership if c["t"] == "joined"} == set(on_worker_1)
    sizes = [c["size"] for c in run.membership if c["t"] == "ring"]
    assert sizes[0] == 4 and sizes[-1] == 4 and 2 in sizes, sizes
    assert not run.unended()


SHIPPED_CELL = """\
import os, importlib.metadata as md
import shiptest, hvd_magic
(shiptest.VERSION, md.version("shiptest"), os.environ.get("HVD_TEST_WORKER"),
 os.path.dirname(os.path.dirname(hvd_magic.__file__)))
"""


def test_a_package_installed_in_the_notebook_reaches_executors_that_lack_it(
        ip, on_lacking_executors, capsys, tmp_path):
    """hvd_magic itself, what its ranks need and the cell's package (another version on one
    worker) are shipped to executors whose Python has none of them: a cell, a second run of it
    (nothing sent again), a function and a script all run there with the notebook's versions."""
    from hvd_magic.task.shipped import cache_root
    ip.run_cell_magic("horovod", "--np 4 --text", SHIPPED_CELL)
    said = capsys.readouterr().out
    first = hvd_magic.last_run()
    assert {r[:2] for r in first.results} == {("1.0", "1.0")}
    assert {r[2] for r in first.results} == {"0", "1"}  # both workers' Pythons
    assert all(r[3].startswith(cache_root()) for r in first.results)  # the shipped hvd_magic
    assert "sent to the executors: hvd_magic" in said and "shiptest 1.0" in said
    assert "psutil" in said and "cloudpickle" in said and "torch" not in said

    ip.run_cell_magic("horovod", "--np 4 --text", SHIPPED_CELL)
    assert "sent to the executors" not in capsys.readouterr().out
    assert sorted(hvd_magic.last_run().results) == sorted(first.results)

    def version():
        import shiptest
        return shiptest.VERSION
    assert hvd_magic.run(version, np=2, view=TextView(quiet=True)).results == ["1.0", "1.0"]

    script = tmp_path / "train.py"
    script.write_text("import shiptest\nprint('shiptest', shiptest.VERSION)\n")
    ip.run_line_magic("horovod", f"--np 2 --quiet {script}")
    run = hvd_magic.last_run()
    assert all("shiptest 1.0" in open(run.log_path(k)).read() for k in range(2))


def test_a_compiled_package_that_cannot_run_on_the_executors_is_refused_before_any_rank(
        ip, on_lacking_executors):
    """fastlib 2.0 needs a newer glibc than the executors have: the run fails before any rank
    starts, naming the notebook's version and the executor's (1.0, or none)."""
    with pytest.raises(hvd_magic.RankError) as failed:
        ip.run_cell_magic("horovod", "--np 4 --quiet", "import fastlib\nfastlib.__version__")
    run = hvd_magic.last_run()
    assert all(r.pid is None for r in run.ranks)  # no rank process was started
    message = str(failed.value)
    assert "CannotShip: fastlib 2.0 from the notebook" in message
    assert "it needs glibc 2.99 or newer" in message
    summaries = " ".join(f["message"] for f in run.failures)
    assert "the executor has fastlib 1.0" in summaries
    assert "the executor has no fastlib" in summaries


def test_a_warm_session_gets_what_the_executors_lack(ip, fresh_ns, on_lacking_executors,
                                                     capsys):
    """A warm session started with --ship shiptest on the executors that have only Python and
    torch: its cells import the package."""
    ip.run_line_magic("horovod_session", "start --np 2 --ship shiptest")
    try:
        said = capsys.readouterr().out
        assert "sent to the executors: hvd_magic" in said and "shiptest 1.0" in said
        assert ip.run_cell_magic("horovod", "--quiet", "import shiptest\nshiptest.VERSION") == "1.0"
    finally:
        ip.run_line_magic("horovod_session", "stop")


def test_hvd_run_gets_what_the_executors_lack(standalone, executors_lacking, tmp_path):
    """A terminal's hvd-run of a script (its own Python, the package on its path) on the
    executors that have only Python and torch."""
    from conftest import ROOT, _stop_spark
    _stop_spark()  # (a session of this process would hold the cluster's cores)
    python, notebook = executors_lacking
    script = tmp_path / "show.py"
    script.write_text("import shiptest\nprint('shiptest', shiptest.VERSION)\n")
    env = dict(os.environ, PYSPARK_PYTHON=python, PYTHONPATH=os.pathsep.join([notebook, ROOT]))
    done = subprocess.run(
        [sys.executable, "-m", "hvd_magic", "-np", "2", "--master", standalone.url,
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--conf", "spark.executor.memory=1g", str(script)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("] shiptest 1.0\n") == 2, done.stdout  # ([rank k] ...)
    assert "sent to the executors: hvd_magic" in done.stdout + done.stderr
