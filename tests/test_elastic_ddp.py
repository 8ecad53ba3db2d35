"""Elastic torch.distributed (`hvd_magic.elastic`, no Horovod): a rank process SIGKILLed from
outside mid-training; the survivors go on in the same processes from their last commit, a
replacement joins at a later commit, and every rank ends with the weights one process gets by
training the same batches (real processes, real Gloo, real kills; on the driver and on Spark)."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic.errors import LaunchError, RankError
from hvd_magic.launch.elastic import launcher as elastic

from conftest import cancelled_if_running, spark_session

COMMIT_EVERY = 5

# A DDP loop written with hvd_magic.elastic, as a user writes it. Each step's batch depends on the
# step and the rank; each step's world size is kept in the state (rolled back with it), so a
# reference can replay the committed trajectory. After the loop, the ranks wait at commits
# until the world is `grow_to` again (where a replacement joins). Free names: steps, grow_to,
# raise_at (slot 1 raises a ValueError at that step).
CELL = """\
import os, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import hvd_magic
from hvd_magic import elastic

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
start = [p.detach().clone() for p in model.parameters()]
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
state = elastic.TorchState(model=model, optimizer=optimizer, step=0, worlds=[])

@elastic.run
def train(state):
    ddp = DDP(state.model)
    while state.step < steps:
        seed = 1000 * state.step + dist.get_rank()
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
        optimizer.zero_grad()
        (ddp(x) - x.sum(1, keepdim=True)).pow(2).mean().backward()
        optimizer.step()
        state.worlds.append(dist.get_world_size())
        state.step += 1
        if state.step == raise_at and os.environ["HVD_MAGIC_ELASTIC_SLOT"] == "1":
            raise ValueError(f"a bad batch at step {state.step}")
        if state.step % 5 == 0:
            state.commit()
        hvd_magic.report(step=state.step, total=steps)
        time.sleep(0.02)
    give_up = time.monotonic() + 120
    while dist.get_world_size() < grow_to and time.monotonic() < give_up:
        state.commit()
        time.sleep(0.05)

train(state)
{"weights": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
 "moved": any(not torch.equal(p, s) for p, s in zip(model.parameters(), start)),
 "worlds": state.worlds, "size": dist.get_world_size(), "rank": dist.get_rank()}
"""


def reference_weights(worlds):
    """One process, the same start, each step on the batches of that step's ranks (DDP's mean
    of their gradients is the gradient of the mean loss over all their rows)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, size in enumerate(worlds):
        x = torch.cat([torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 * step + r))
                       for r in range(size)])
        optimizer.zero_grad()
        (model(x) - x.sum(1, keepdim=True)).pow(2).mean().backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


# Prepended to CELL: slot 1 hears of each world after the second (a joiner's) 0.3 s after the
# others do, as a busy host's rank may; and every DDP wrapper is kept, as code that keeps its
# wrapper keeps its process group (and its connections) alive after the group is destroyed.
LATE_WORD = """\
import os, threading
import torch.nn.parallel
from hvd_magic.rank import elastic_world
kept, made = [], torch.nn.parallel.DistributedDataParallel.__init__
def keep(self, *args, **kwargs):
    made(self, *args, **kwargs)
    kept.append(self)
torch.nn.parallel.DistributedDataParallel.__init__ = keep
if os.environ["HVD_MAGIC_ELASTIC_SLOT"] == "1":
    here, heard = elastic_world.world(), elastic_world.world().heard
    def late(message):
        if message.get("t") == "reform" and message["g"] >= 2:
            threading.Timer(0.3, heard, [message]).start()
        else:
            heard(message)
    here.heard = late
"""


@contextlib.contextmanager
def _elastic_run(ip, options, cell=CELL):
    """`cell` in the background; cancelled if a test fails half-way."""
    run = ip.run_cell_magic("distributed", f"{options} --background --quiet", cell)
    with cancelled_if_running(run):
        yield run


def _kill_at_step(run, slot, step):
    """SIGKILL slot `slot`'s rank process from outside once it reported `step`."""
    victim = run.ranks[slot]
    deadline = time.monotonic() + 120
    while (victim.step or 0) < step:
        assert run.state == "running", f"the run ended ({run.state}: {run.error}) first"
        assert time.monotonic() < deadline, f"slot {slot} never reached step {step}"
        time.sleep(0.02)
    pid = victim.pid
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.parametrize("np", ["-3", "3"], ids=["driver", "spark"])
def test_survivors_of_a_killed_rank_go_on_and_train_what_one_process_would(ip, fresh_ns, np):
    if np == "3":
        spark_session(4)  # the shared embedded session: each slot a plain task
    fresh_ns.update(steps=80, grow_to=3, raise_at=None)
    with _elastic_run(ip, f"--np {np} --min-np 2") as run:
        pid = _kill_at_step(run, 2, 20)
        results = run.wait(240)

    assert run.state == "done", run.error
    assert len(results) == 3  # the replacement joined and finished with the others
    worlds = results[0]["worlds"]
    assert len(worlds) == 80 and 2 in worlds and worlds[0] == worlds[-1] == 3, worlds
    expected = reference_weights(worlds)
    for r in results:
        assert r["moved"] and r["size"] == 3 and r["worlds"] == worlds
        assert r["weights"] == pytest.approx(expected, abs=1e-5)
    assert sorted(r["rank"] for r in results) == [0, 1, 2]

    # membership: slot 2 lost by SIGKILL, a world of 2 at once, a replacement, a world of 3
    changes = [(c["t"], c.get("rank"), c.get("size")) for c in run.membership]
    lost = next(c for c in run.membership if c["t"] == "lost")
    assert lost["rank"] == 2 and lost["pid"] == pid and lost["code"] == -signal.SIGKILL
    after = changes[changes.index(("lost", 2, None)):]
    assert after[1] == ("ring", None, 2), changes
    assert ("joined", 2, None) in after and after[-1] == ("ring", None, 3), changes
    assert [c["t"] for c in run.membership].count("ring") == 3, changes  # no world but these
    # in its own words: worlds, not Horovod's rings (#66)
    assert {c["formed"] for c in run.membership if c["t"] == "ring"} == {"world"}
    assert "Horovod" not in run.elastic.summary() and "world of 2: slots" in run.elastic.summary()


def test_two_ranks_lost_a_moment_apart_leave_the_others_training(ip, fresh_ns):
    """Two ranks SIGKILLed 30 ms apart, as a lost worker's two slots die: the world formed after
    the first loss breaks while it forms (a member of it is gone), and the replacements may
    join while the others form the next. Every world is made all the same (a rank whose group
    failed to form is named like its peers' next time, and says so to the driver); the run
    ends with every rank and the weights one process gets from the same batches. (A
    standalone cluster's fresh-clone runs hung here: the survivors' groups never formed.)"""
    fresh_ns.update(steps=60, grow_to=4, raise_at=None)
    with _elastic_run(ip, "--np -4 --min-np 2") as run:
        _kill_at_step(run, 3, 15)
        time.sleep(0.03)
        os.kill(run.ranks[2].pid, signal.SIGKILL)
        results = run.wait(240)

    assert run.state == "done", run.error
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    worlds = results[0]["worlds"]
    assert len(worlds) == 60 and worlds[0] == worlds[-1] == 4, worlds
    expected = reference_weights(worlds)
    for r in results:
        assert r["weights"] == pytest.approx(expected, abs=1e-5) and r["worlds"] == worlds
    assert sorted(c["rank"] for c in run.membership if c["t"] == "lost") == [2, 3]
    # the survivors' world formed at once, without the lost; whether a step was trained in it
    # depends on how soon the replacements joined (on a quick machine, before the next step)
    sizes = [c["size"] for c in run.membership if c["t"] == "ring"]
    assert sizes[0] == sizes[-1] == 4 and min(sizes) < 4, run.membership


def test_a_rank_that_hears_of_a_joiner_late_leaves_with_the_others(ip, fresh_ns):
    """The others leave for a joiner's world at a commit; a rank whose word from the driver is
    still on its way leaves at that same commit (it would otherwise go on to the next step's
    collective alone, and wait there for peers that left)."""
    fresh_ns.update(steps=60, grow_to=3, raise_at=None)
    with _elastic_run(ip, "--np -3 --min-np 2", LATE_WORD + CELL) as run:
        _kill_at_step(run, 2, 15)
        results = run.wait(120)

    assert run.state == "done", run.error
    worlds = results[0]["worlds"]
    assert len(worlds) == 60 and 2 in worlds and worlds[-1] == 3, worlds
    expected = reference_weights(worlds)
    for r in results:
        assert r["weights"] == pytest.approx(expected, abs=1e-5) and r["worlds"] == worlds


def test_a_rank_that_raises_ends_the_run_with_its_traceback(ip, fresh_ns):
    fresh_ns.update(steps=80, grow_to=0, raise_at=12)
    with pytest.raises(RankError) as info:
        ip.run_cell_magic("distributed", "--np -3 --min-np 2 --quiet", CELL)
    text = "\n".join(info.value._render_traceback_())
    assert "rank 1" in text and "ValueError: a bad batch at step 12" in text, text
    run = hvd_magic.last_run()
    assert [c["t"] for c in run.membership] == ["ring"]  # no loss: an error, not a lost rank


def test_too_few_left_for_the_elastic_timeout_ends_the_run_saying_so(ip, fresh_ns, monkeypatch):
    monkeypatch.setattr(elastic, "REPLACEMENTS_PER_SLOT", 0)  # a lost rank stays lost
    fresh_ns.update(steps=100_000, grow_to=0, raise_at=None)
    with _elastic_run(ip, "--np -2 --min-np 2 --elastic-timeout 3") as run:
        _kill_at_step(run, 1, 5)
        with pytest.raises(LaunchError) as info:
            run.wait(120)
    message = str(info.value)
    assert "fewer than --min-np 2 ranks were left" in message, message
    assert "rank 1 (hvd-s1-a1) killed by SIGKILL" in message, message
    assert run.ranks[0].state == "stopped"  # the survivor waited, then was stopped


def test_min_np_on_code_with_no_elastic_api_says_what_to_do(ip, tmp_path):
    cell = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
    runs_before = len(hvd_magic.runs())
    for run in (lambda: ip.run_cell_magic("distributed", "--np -2 --min-np 1", cell),
                lambda: hvd_magic.run_script(tmp_path / "train.py", np=-2, min_np=1)):
        (tmp_path / "train.py").write_text(cell)
        with pytest.raises(UsageError) as info:
            run()
        assert type(info.value) is UsageError  # (a subclass prints a full traceback)
        message = str(info.value)
        assert "use hvd_magic.elastic" in message and "Or drop --min-np" in message, message
    assert len(hvd_magic.runs()) == runs_before  # refused before anything started


SCRIPT = """\
import os, signal, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from hvd_magic import elastic

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
state = elastic.TorchState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           step=0)
marker = sys.argv[1]

@elastic.run
def train(state):
    ddp = DDP(state.model)
    while state.step < 30:
        ddp(torch.randn(4, 4)).sum().backward()
        state.step += 1
        if state.step == 12 and dist.get_rank() == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # once: its replacement goes on
        if state.step % 5 == 0:
            state.commit()
    while dist.get_world_size() < 2:  # the replacement joins at a commit
        state.commit()
        time.sleep(0.05)

train(state)
print("trained", state.step, "steps in a world of", dist.get_world_size())
"""


def test_a_script_is_elastic_too(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = hvd_magic.run_script(script, [str(tmp_path / "killed")], np=-2, min_np=1, timeout=180)
    assert run.state == "done" and (tmp_path / "killed").exists()
    assert [c["t"] for c in run.membership][:3] == ["ring", "lost", "ring"], run.membership
    for slot in (0, 1):  # (slot 1's latest attempt: the replacement)
        with open(run.log_path(slot)) as log:
            assert "trained 30 steps in a world of 2" in log.read()


def test_an_elastic_torch_session_goes_on_with_its_survivors(ip):
    """``%horovod_session start --min-np 2 --elastic-api torch``: a rank SIGKILLed between cells;
    the next cell runs on the survivors in a world of 2, their earlier cells' values kept."""
    magics = ip.magics_manager.registry["HorovodMagics"]
    ip.run_line_magic("horovod_session", "start --np -3 --min-np 2 --elastic-api torch")
    session = magics.session
    try:
        ip.run_cell_magic("distributed", "--quiet", (
            "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "model = torch.nn.Linear(4, 1)\nt = torch.ones(1)\ndist.all_reduce(t)\n"
            "first = (dist.get_world_size(), t.item())"))
        pid = session.ranks[2]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not any(slots == [0, 1] for _, slots in session.rings):
            assert time.monotonic() < deadline, "no world of the 2 survivors"
            time.sleep(0.05)
        ip.run_cell_magic("distributed", "--quiet", (
            "t = torch.ones(1)\ndist.all_reduce(t)\n"
            "(first, dist.get_world_size(), dist.get_rank(), t.item(), type(model).__name__)"))
        assert sorted(hvd_magic.last_run().results) == [
            ((3, 3.0), 2, 0, 2.0, "Linear"), ((3, 3.0), 2, 1, 2.0, "Linear")]
        assert 2 in session.lost
    finally:
        ip.run_line_magic("horovod_session", "stop")


STALE_STORE = """\
import os, socket, threading, time
import torch.distributed  # (imported first: the newer world comes while the member connects)
os.environ["HVD_MAGIC_ELASTIC"] = "torch"
from hvd_magic.rank.elastic_world import World
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()  # a store its maker left for a newer world: nothing listens there any more
world = World(slot=2)
world.heard({"t": "reform", "g": 2, "slots": [0, 1, 2]})
world.heard({"t": "world", "g": 2, "addr": "127.0.0.1", "port": port})
threading.Timer(1.0, world.heard, [{"t": "reform", "g": 3, "slots": [0, 2]}]).start()
print(world._store(world.reform, 2, 3))
"""


def test_a_member_connecting_to_a_store_left_for_a_newer_world_goes_to_the_newer_one():
    """Two ranks of one worker lost a moment apart (a standalone cluster's fresh-clone run): the
    world of 3 formed after the first loss had its store left by its maker for the world of 2;
    a member still connecting to it leaves that connection once the newer world is heard,
    instead of retrying it for the store's whole timeout (60 s)."""
    done = subprocess.run([sys.executable, "-c", STALE_STORE], capture_output=True, text=True,
                          timeout=40)
    assert done.stdout.strip() == "None", done.stdout + done.stderr


def _kill_every_rank_at_step(run, step):
    """SIGKILL every rank process at once (a few ms apart), once slot 0 reported `step`."""
    _kill_at_step(run, 0, step)
    for r in run.ranks[1:]:
        os.kill(r.pid, signal.SIGKILL)


def test_a_run_that_lost_every_rank_fails_naming_what_was_lost(ip, fresh_ns):
    """Every rank killed within milliseconds: no survivor holds the last commit. The run must not
    start over from step 0 unasked (replacements retrained from scratch, twice, and the cell
    ended `done`): it fails, saying the state went with them; no world line names a dead slot."""
    fresh_ns.update(steps=100_000, grow_to=0, raise_at=None)
    with _elastic_run(ip, "--np -2 --min-np 1") as run:
        _kill_every_rank_at_step(run, 12)
        with pytest.raises(LaunchError) as info:
            run.wait(120)
    message = str(info.value)
    assert "every rank of the last world was lost" in message, message
    assert "went with them" in message and "--restart-from-scratch" in message, message
    assert "rank 0: killed by SIGKILL" in message and "rank 1: killed by SIGKILL" in message
    assert "rank-0.txt" in message  # the lost ranks' logs
    # no replacement trained from step 0: none was in a world (one may have started to join
    # the survivor the first loss left, itself lost a moment later)
    assert all(a == 1 for c in run.membership if c["t"] == "ring" for a in c["attempts"])


def test_restart_from_scratch_lets_replacements_start_over_and_says_so(ip, fresh_ns, capsys):
    fresh_ns.update(steps=30, grow_to=2, raise_at=None)
    run = ip.run_cell_magic("distributed", "--np -2 --min-np 1 --restart-from-scratch "
                                           "--background", CELL)
    try:
        _kill_every_rank_at_step(run, 12)
        results = run.wait(240)
    finally:
        if run.state == "running":
            run.cancel()
    assert run.state == "done", run.error
    worlds = results[0]["worlds"]
    assert len(worlds) == 30, worlds  # every step trained again, from step 0
    said = capsys.readouterr()
    assert "The replacements start over from step 0 (--restart-from-scratch)" in \
        said.out + said.err
    # the world the replacements formed is told; none names a slot already dead
    lost_at = max(c["time"] for c in run.membership if c["t"] == "lost")
    assert [c for c in run.membership if c["t"] == "ring" and c["time"] > lost_at]
    # the killed process's log is linked beside its replacement's
    from hvd_magic.view.table import _log_links
    links = _log_links(run, 0)
    assert "rank-0.attempt2.txt" in links and "(lost: " in links and "rank-0.txt" in links

