"""Elastic runs, driver-only: a rank process SIGKILLed mid-training is replaced, the others go on
from their last commit, and the run ends with the survivors' results (real processes, real
Horovod elastic, a real kill)."""

import contextlib
import json
import logging
import os
import re
import signal
import threading
import time

import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic.driver.membership import Membership
from hvd_magic.driver.ranks import RankState
from hvd_magic.driver.watchdog import stall_message
from hvd_magic.errors import LaunchError, RankError, RunTimeout
from hvd_magic.launch.elastic import launcher as elastic

from conftest import cancelled_if_running, spark_session

COMMIT_EVERY = 10
GLOO_TIMEOUT = 10  # bounds how long a survivor may wait on the lost peer before it resets


# A cell written against Horovod's elastic API, as a user writes it: TorchState, commit every
# COMMIT_EVERY steps, the step each (re)start of the loop began from kept (a restore goes back
# to a commit). Its free names: steps, commit_every, grow_to.
ELASTIC_CELL = """\
import time
import horovod.torch as hvd
import torch
import hvd_magic

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0)
starts = []

@hvd.elastic.run
def train(state):
    starts.append(state.step)
    while state.step < steps:
        x = torch.randn(8, 4)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        state.step += 1
        if state.step % commit_every == 0:
            state.commit()
        hvd_magic.report(step=state.step, total=steps)
        time.sleep(0.05)
    # a test that needs the ring whole at the end waits for it at commits, where Horovod lets a
    # new rank in (a replacement takes seconds to start on a busy machine)
    give_up = time.monotonic() + 120
    while hvd.size() < grow_to and time.monotonic() < give_up:
        state.commit()
        time.sleep(0.2)

train(state)
{"step": state.step, "starts": starts, "weights": [p.detach().flatten().tolist() for p in model.parameters()],
 "local": [hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]}
"""


def _wait_for(run, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if run.state != "running":
            raise AssertionError(f"the run ended ({run.state}: {run.error}) before {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("np", ["-3", "3"], ids=["driver", "spark"])
def test_killed_rank_is_replaced_and_the_run_ends_with_the_survivors(ip, fresh_ns, capfd, np,
                                                                    monkeypatch):
    if np == "3":
        spark_session(4)  # the shared embedded session: slots are plain tasks there
    else:  # Horovod's first word of the replacement's host does not reach rank 0 (as when it
        # was re-initialising): the launcher tells it again
        told = _drop_the_first_news_of_a_new_host(monkeypatch)
    fresh_ns.update(steps=150, commit_every=COMMIT_EVERY, grow_to=3)
    with _elastic_run(ip, f"--np {np} --min-np 2 --export starts", view="--text") as run:
        pid, seen = _kill_rank_1_at_step(run, 25)
        results = run.wait(240)

    assert run.state == "done"
    # every rank that finished has the same weights and the full step count
    assert len(results) >= 2
    assert all(r["weights"] == results[0]["weights"] for r in results)
    assert all(r["step"] == 150 for r in results)
    # the survivors restarted from a commit no earlier than the last one before the kill
    last_commit = seen // COMMIT_EVERY * COMMIT_EVERY
    for r in results:
        assert all(s % COMMIT_EVERY == 0 for s in r["starts"]), r["starts"]
        assert r["starts"] == sorted(r["starts"]), r["starts"]
    survivors = [r for r in results if r["starts"][0] == 0]
    assert survivors, results
    for r in survivors:
        assert r["starts"][1:] and r["starts"][1] >= last_commit, (r["starts"], seen)
    # one machine: local ranks 0..2 of 3, one cross ring, as horovodrun gives; the survivors
    # were told theirs by the re-formed ring, the replacement by its start
    assert sorted(r["local"][0] for r in results) == list(range(len(results)))
    assert all(r["local"][1:] == [len(results), 0, 1] for r in results), results

    # membership: rank 1 lost by SIGKILL with its last line and key, a replacement joined, the
    # ring went 3 -> 2 -> 3; all of it in events.jsonl and run.json
    kinds = [c["t"] for c in run.membership]
    lost = [c for c in run.membership if c["t"] == "lost"]
    assert lost[0]["rank"] == 1 and lost[0]["pid"] == pid and lost[0]["code"] == -signal.SIGKILL
    assert lost[0]["key"] == "hvd-s1-a1"
    # Rarely, a survivor aborts in Gloo as its peer dies (Horovod #2484: "terminate called after
    # throwing gloo::EnforceNotMet"): it is lost and replaced the same way
    also = lost[1:]
    assert all(c["code"] == -signal.SIGABRT for c in also), also
    joined = [c for c in run.membership if c["t"] == "joined"]
    assert sorted(c["rank"] for c in joined) == sorted(c["rank"] for c in lost), joined
    assert next(c for c in joined if c["rank"] == 1)["key"] == "hvd-s1-a2"
    sizes = [c["size"] for c in run.membership if c["t"] == "ring"]
    assert sizes[0] == 3 and sizes[-1] == 3 and (also or 2 in sizes), sizes
    assert kinds.index("lost") < kinds.index("joined")
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        recorded = [json.loads(line)["t"] for line in f]
    assert {"lost", "joined", "ring"} <= set(recorded)
    with open(os.path.join(run.run_dir, "run.json")) as f:
        assert [c["t"] for c in json.load(f)["membership"]] == kinds
    # both attempts' logs are kept
    first, second = (os.path.join(run.run_dir, n) for n in ("rank-1.log", "rank-1.attempt2.log"))
    assert os.path.exists(first) and os.path.exists(second)
    assert run.log_path(1) == second
    assert hvd_magic.last_run().membership == run.membership
    assert run.exports["starts"] in [r["starts"] for r in results]  # from Horovod's rank 0
    # the text view said it as it happened, and sums it up at the end
    out, err = capfd.readouterr()
    # (our own news, not errors: on stdout, never in a notebook's red stderr)
    assert f"[hvd_magic] rank 1 lost (hvd-s1-a1, pid {pid}, killed by SIGKILL)" in out
    assert "last line: ''" not in out
    assert "[hvd_magic] rank 1 replaced: attempt 2 started (hvd-s1-a2" in out
    assert also or "[hvd_magic] ring of 2 ranks: slots 0, 2" in out
    # which Horovod rank each row is, where they differ (Horovod orders its ring itself)
    for change in (c for c in run.membership if c["t"] == "ring"):
        order = change["order"]
        assert sorted(order) == change["slots"]
        moved = [f"slot {s} is Horovod rank {i} in it" for i, s in enumerate(order) if s != i]
        assert not moved or f"({', '.join(moved)})" in out
    assert [r.horovod_rank for r in run.ranks] == [order.index(r.rank) for r in run.ranks]
    assert "rank 1 lost" not in err
    assert "membership:" in out and "rank 1 joined (attempt 2, hvd-s1-a2)" in out
    assert not run.unended()
    if np == "-3":
        assert len(told) >= 2, told


def _drop_the_first_news_of_a_new_host(monkeypatch):
    """Horovod's driver tells rank 0 of added hosts: the first time (after the first ring) is
    lost. Each call is listed."""
    from horovod.runner.elastic.driver import ElasticDriver
    from horovod.runner.elastic.worker import HostUpdateResult

    tell = ElasticDriver._notify_workers_host_changes
    told = []

    def lose_the_first(driver, hosts, update):
        if update & HostUpdateResult.added and driver.get_coordinator_info() is not None:
            told.append(update)
            if len(told) == 1:
                return None
        return tell(driver, hosts, update)

    monkeypatch.setattr(ElasticDriver, "_notify_workers_host_changes", lose_the_first)
    return told


@contextlib.contextmanager
def _elastic_run(ip, options, view="--quiet"):
    """ELASTIC_CELL in the background with `options`; cancelled if a test fails half-way."""
    run = ip.run_cell_magic("horovod", f"{options} --background {view} --env "
                                       f"HOROVOD_GLOO_TIMEOUT_SECONDS={GLOO_TIMEOUT}", ELASTIC_CELL)
    with cancelled_if_running(run):
        yield run


def _kill_rank_1_at_step(run, step):
    victim = run.ranks[1]
    _wait_for(run, lambda: (victim.step or 0) >= step, 120, f"rank 1 to reach step {step}")
    seen = victim.step
    os.kill(victim.pid, signal.SIGKILL)  # a real kill of the rank process, from outside
    return victim.pid, seen


def test_too_few_ranks_for_longer_than_the_elastic_timeout_is_a_clear_error(
        ip, fresh_ns, monkeypatch):
    monkeypatch.setattr(elastic, "REPLACEMENTS_PER_SLOT", 0)  # a lost rank stays lost
    fresh_ns.update(steps=10_000, commit_every=COMMIT_EVERY, grow_to=0)
    with _elastic_run(ip, "--np -2 --min-np 2 --elastic-timeout 3") as run:
        pid, _ = _kill_rank_1_at_step(run, 5)
        with pytest.raises(LaunchError) as caught:
            run.wait(120)
    message = str(caught.value)
    assert run.state == "failed" and not run.unended()
    lost = [c for c in run.membership if c["t"] == "lost"]
    assert lost[0]["rank"] == 1 and lost[0]["pid"] == pid
    # the run's own numbers: the seconds Horovod's driver waited for a second rank (from the
    # loss, at most until the run ended), this run's elastic timeout, the rank lost and when
    waited = re.search(r"fewer than --min-np 2 ranks were left for (\d+) s, the elastic "
                       r"timeout \(3 s\)", message)
    assert waited, message
    assert 3 <= int(waited.group(1)) <= run.ended - lost[0]["time"] + 1, (message, run.ended)
    assert "Lost: rank 1 (hvd-s1-a1) killed by SIGKILL at " in message
    assert any(time.strftime("%H:%M:%S", time.localtime(lost[0]["time"] + d)) in message
               for d in (-1, 0, 1)), (message, lost)  # (the loop heard it a moment apart)


def test_losing_every_rank_of_a_horovod_ring_fails_naming_what_was_lost(ip, fresh_ns):
    """Horovod's elastic driver restarts the workers of a ring it lost whole, and they train
    again from their first step: the driver stops the run instead, saying the state went."""
    fresh_ns.update(steps=10_000, commit_every=COMMIT_EVERY, grow_to=0)
    with _elastic_run(ip, "--np -2 --min-np 1") as run:
        _kill_rank_1_at_step(run, 5)
        os.kill(run.ranks[0].pid, signal.SIGKILL)
        with pytest.raises(LaunchError) as caught:
            run.wait(120)
    message = str(caught.value)
    assert "every rank of the last ring was lost" in message, message
    assert "rank 0: killed by SIGKILL" in message and "rank 1: killed by SIGKILL" in message
    assert "--restart-from-scratch" in message and not run.unended()


def test_an_elastic_reset_is_not_a_hang():
    """Survivors waiting in hvd.init() for the ring to re-form, a lost rank: no stall reported;
    the same ranks in a run that is not elastic are one."""
    ranks = [RankState(r) for r in range(3)]
    now = time.monotonic()
    for r in ranks[::2]:
        r.blocked_op, r.blocked_since = "init", now - 100
    ranks[1].state, ranks[1].exit = "lost", {"code": -9, "status": "died"}
    assert stall_message(ranks, 60, now) is not None
    assert stall_message(Membership(3, 2, 3).watched(ranks), 60, now) is None


def test_a_spark_elastic_run_grows_beyond_np_when_spark_has_room(ip, fresh_ns, tmp_path):
    """--np 2 --max-np 3 while another job holds every core but 2: the run starts on 2 ranks;
    the job ends, Spark runs the third slot's task, and its rank joins at a commit."""
    import threading

    from hvd_magic.launch.spark import local_slots

    sc = spark_session(4).sparkContext
    held, release = local_slots(sc.master) - 2, str(tmp_path / "release")

    def hold(_):
        import os
        import time
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.1)
        return []

    holder = threading.Thread(target=lambda: sc.parallelize(range(held), held)
                              .mapPartitions(hold).collect())
    holder.start()
    try:
        _wait_for_running_tasks(sc, held)
        fresh_ns.update(steps=60, commit_every=COMMIT_EVERY, grow_to=3)
        with _elastic_run(ip, "--np 2 --min-np 2 --max-np 3") as run:
            _wait_for(run, lambda: sum((r.step or 0) >= 20 for r in run.ranks) == 2, 120,
                      "2 ranks at step 20")
            # (Spark picks which slot's task waits: each slot is a job of its own)
            third = next(r.rank for r in run.ranks if r.pid is None)  # its task waits for a core
            open(release, "w").close()
            results = run.wait(240)
    finally:
        open(release, "w").close()
        holder.join(60)
    assert run.state == "done", run.error
    assert len(results) == 3 and all(r["weights"] == results[0]["weights"] for r in results)
    assert all(r["step"] == 60 for r in results)
    assert [c["size"] for c in run.membership if c["t"] == "ring"] == [2, 3]
    assert not [c for c in run.membership if c["t"] == "lost"]
    joined_at = results[third]["starts"]
    assert len(joined_at) == 1 and joined_at[0] >= 20 and joined_at[0] % COMMIT_EVERY == 0
    assert all(r["starts"] == [0] + joined_at for i, r in enumerate(results) if i != third)
    assert not run.unended()


def _wait_for_running_tasks(sc, n, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tracker = sc.statusTracker()
        running = sum(tracker.getStageInfo(s).numActiveTasks for s in tracker.getActiveStageIds()
                      if tracker.getStageInfo(s) is not None)
        if running >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {n} tasks to run")


@pytest.mark.parametrize("np", ["-2", "2"], ids=["driver", "spark"])
def test_timeout_ends_every_rank_of_an_elastic_run(ip, fresh_ns, np):
    fresh_ns.update(steps=10_000, commit_every=COMMIT_EVERY, grow_to=0)
    # on Spark, a slot beyond what the session can hold waits in Spark's queue: the end
    # cancels it too
    more = " --max-np 9" if np == "2" else ""
    if np == "2":
        sc = spark_session(4).sparkContext
    with pytest.raises(RunTimeout):
        ip.run_cell_magic("horovod", f"--np {np} --min-np 1{more} --timeout 8 --quiet",
                          ELASTIC_CELL)
    run = hvd_magic.last_run()
    assert run.state == "timeout" and not run.unended()
    assert all(r.exit is not None for r in run.ranks if r.pid is not None)
    if np == "2":  # no Spark job of the run is left, waiting or running
        # (the ranks Horovod took: the first 2 at once, more as their tasks came, within 4)
        assert len(run.ranks) == 9 and 2 <= sum(r.pid is not None for r in run.ranks) <= 4
        assert not [j for j in run.launcher.job_ids()
                    if sc.statusTracker().getJobInfo(j).status == "RUNNING"]


def test_an_error_in_the_cell_fails_an_elastic_run_with_its_traceback(ip, caplog, capfd):
    """A bug is not a lost rank: no replacement, the others are stopped, the run ends at once.
    Horovod's driver's own log lines (it counts the stopped ranks as failed) go to the run
    folder, not under the cell."""
    cell = ("import time, horovod.torch as hvd\nhvd.init()\n"
            "if hvd.rank() == 1:\n    raise ValueError('a bug on rank 1')\ntime.sleep(600)\n")
    with pytest.raises(RankError, match="a bug on rank 1"):
        ip.run_cell_magic("horovod", "--np -2 --min-np 1 --quiet", cell)
    run = hvd_magic.last_run()
    assert run.state == "failed" and not run.unended()
    assert not [c for c in run.membership if c["t"] in ("lost", "joined")]
    with open(os.path.join(run.run_dir, "elastic.log")) as f:
        assert "ERROR failure count == 2 -> stop running" in f.read()
    assert not [r for r in caplog.records if "horovod" in r.pathname]  # no handler saw them
    assert "failure count" not in capfd.readouterr().err
    assert not logging.getLogger().filters  # the route ended with the run


def test_elastic_options_are_checked():
    with pytest.raises(UsageError, match="min_np <= ranks <= max_np"):
        hvd_magic.run(print, np=-3, min_np=4)
    with pytest.raises(UsageError, match="add --min-np"):
        hvd_magic.run(print, np=-3, max_np=4)


def test_a_worker_waiting_in_a_barrier_our_stop_broke_is_answered(capfd):
    """`ElasticLauncher._stop_horovod_later` breaks the barrier of Horovod's real driver where a
    worker's ``rank_and_size`` waits: the worker gets an answer (503), and no thread prints a
    traceback (it did, in a fresh-clone run, outside any cell)."""
    import urllib.error
    import urllib.request

    from horovod.runner.elastic.discovery import FixedHosts
    from horovod.runner.elastic.driver import ElasticDriver
    from horovod.runner.http.http_server import RendezvousServer

    from hvd_magic.launch.elastic.hosts import machine_rendezvous

    rendezvous = RendezvousServer()
    driver = ElasticDriver(rendezvous, FixedHosts({}), min_num_proc=1, max_num_proc=2)
    try:
        port = rendezvous.start(machine_rendezvous(driver, dict))
        driver._worker_registry.reset(2)
        driver._worker_registry._barrier.abort()
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/rank_and_size/hvd-s0-a1:0", timeout=30)
        assert answer.value.code == 503
    finally:
        driver.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_a_worker_killed_before_its_answer_leaves_no_traceback(capfd):
    """A worker asks its ``rank_and_size`` and is killed while the answer waits (here in the
    barrier, then broken): writing the answer fails, and no thread prints a BrokenPipeError's
    traceback on the notebook's stderr (a fresh clone's run printed one)."""
    import socket
    import struct

    from horovod.runner.elastic.discovery import FixedHosts
    from horovod.runner.elastic.driver import ElasticDriver
    from horovod.runner.http.http_server import RendezvousServer

    from hvd_magic.launch.elastic.hosts import machine_rendezvous

    rendezvous = RendezvousServer()
    driver = ElasticDriver(rendezvous, FixedHosts({}), min_num_proc=1, max_num_proc=2)
    try:
        port = rendezvous.start(machine_rendezvous(driver, dict))
        driver._worker_registry.reset(2)
        worker = socket.create_connection(("127.0.0.1", port))
        worker.sendall(b"GET /rank_and_size/hvd-s0-a1:0 HTTP/1.1\r\nHost: driver\r\n\r\n")
        barrier = driver._worker_registry._barrier
        deadline = time.monotonic() + 30
        while barrier.n_waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert barrier.n_waiting == 1  # its answer waits
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        worker.close()  # killed: its connection reset
        time.sleep(0.2)
        barrier.abort()
        while any("process_request" in t.name for t in threading.enumerate()) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        driver.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_a_worker_exit_recorded_in_a_barrier_our_stop_broke_ends_quietly():
    """A worker's exit is recorded in the barrier of Horovod's real driver; our stop
    (`ElasticLauncher._stop_horovod_later`) breaks it: the thread that recorded it ends without
    an error (it printed a traceback from Horovod's thread in a fresh-clone run)."""
    import threading
    import types

    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.elastic.discovery import FixedHosts
    from horovod.runner.http.http_server import RendezvousServer

    from hvd_magic.launch.elastic.horovod import elastic_driver

    rendezvous = RendezvousServer()
    launcher = types.SimpleNamespace(_waiting_since=None)
    driver = elastic_driver(launcher, rendezvous, FixedHosts({}), min_num_proc=1, max_num_proc=2)
    slot = SlotInfo(hostname="hvd-s0-a1", rank=0, local_rank=0, cross_rank=0, size=2,
                    local_size=1, cross_size=2)
    driver._host_assignments = {slot.hostname: [slot]}
    driver._worker_registry.reset(2)
    raised = []

    def record_exit():
        try:
            driver._handle_worker_exit(slot, 1, time.time())
        except BaseException as exc:  # what Horovod's thread would have printed
            raised.append(exc)

    try:
        rendezvous.start()
        recorder = threading.Thread(target=record_exit)
        recorder.start()
        deadline = time.monotonic() + 30
        while driver._worker_registry._barrier.n_waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert driver._worker_registry._barrier.n_waiting == 1  # the exit waits in the barrier
        driver.stop()
        driver._worker_registry._barrier.abort()
        recorder.join(30)
        assert not recorder.is_alive() and raised == []
    finally:
        driver.stop()
