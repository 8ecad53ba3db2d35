"""torch.distributed in a %%horovod cell: the environment torchrun gives (env://), real ranks."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from IPython.core.error import UsageError

import hvd_magic

torch = pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("line", ["--np -2", "--np 2"])  # on the driver; on Spark local
def test_init_process_group_with_no_argument(ip, line):
    cell = ("import os\n"
            "import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "x = torch.tensor([float(dist.get_rank() + 1)])\n"
            "dist.all_reduce(x)\n"
            "env = {k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'GROUP_RANK',\n"
            "                                   'LOCAL_WORLD_SIZE', 'TORCHELASTIC_USE_AGENT_STORE')}\n"
            "assert env['RANK'] == env['LOCAL_RANK'] == str(dist.get_rank()), env\n"
            "dist.destroy_process_group()\n"
            "(x.item(), env)\n")
    total, env = ip.run_cell_magic("horovod", line, cell)  # rank 0's value
    assert total == 3.0  # 1 + 2: both ranks met in one process group
    assert env == {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "GROUP_RANK": "0",
                   "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "False"}


def test_a_rank_that_raises_ends_the_others_blocked_in_a_collective(ip):
    # (torch's @record writes the failing rank's error to its TORCHELASTIC_ERROR_FILE)
    cell = ("import torch, torch.distributed as dist\n"
            "from torch.distributed.elastic.multiprocessing.errors import record\n"
            "dist.init_process_group('gloo')\n"
            "@record\ndef main():\n"
            "    if dist.get_rank() == 1:\n"
            "        raise ValueError('rank one gives up')\n"
            "    dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that never comes\n"
            "main()\n")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --timeout 120", cell)
    assert info.value.rank == 1
    assert "rank one gives up" in "\n".join(info.value._render_traceback_())
    run = hvd_magic.last_run()
    assert run.state == "failed"  # not the 120 s timeout, nor Gloo's 30 min
    # torch's error file of the failed rank is kept in the run folder
    with open(os.path.join(run.run_dir, "torchelastic", "rank-1", "error.json")) as f:
        assert "rank one gives up" in f.read()


# Each rank trains the same seeded nn.Linear under DDP on batches of its own (seeded by rank and
# step); every rank's weights come back (hvd_magic.last_run().results).
DDP_TRAINING = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(STEPS):
    x, y = batch(step, rank)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
[p.detach() for p in model.parameters()]
"""
# Defined in the notebook (the shell), as a user's: it travels to the ranks by value.
BATCH = """\
import torch
STEPS = 3
def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
"""
_here = {}
exec(BATCH, _here)
batch, STEPS = _here["batch"], _here["STEPS"]


def one_process_on_every_ranks_batches(ranks):
    """What DDP promises: one model trained with plain SGD on the concatenated batches."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        xs, ys = zip(*(batch(step, r) for r in range(ranks)))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("np", ["-2", "2"], ids=["driver", "spark"])
def test_ddp_averages_the_ranks_gradients(ip, fresh_ns, np):
    ip.run_cell(BATCH).raise_error()
    ip.run_cell_magic("horovod", f"--np {np} --quiet", DDP_TRAINING)
    ranks = hvd_magic.last_run().results
    expected = one_process_on_every_ranks_batches(2)
    for weights in ranks:
        assert all(torch.allclose(w, e, atol=1e-6) for w, e in zip(weights, expected)), \
            (weights, expected)
    alone = one_process_on_every_ranks_batches(1)  # rank 0's batches only: not what came back
    assert not torch.allclose(ranks[0][0], alone[0], atol=1e-3)


def test_a_warm_session_keeps_a_process_group_and_makes_it_again(ip, fresh_ns, tmp_path):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        cell = lambda code: ip.run_cell_magic("horovod", "--quiet", code)  # noqa: E731
        assert cell("import os, torch, torch.distributed as dist\n"
                    "dist.init_process_group('gloo')\ndist.get_world_size()") == 2
        reduce = "x = torch.tensor([dist.get_rank() + 1.0])\ndist.all_reduce(x)\nx.item()"
        assert cell(reduce) == 3.0
        # Lightning's LightningEnvironment.teardown() deletes WORLD_SIZE: the next cell has it
        assert cell("del os.environ['WORLD_SIZE']\n" + reduce) == 3.0
        assert cell("dist.destroy_process_group()\ndist.init_process_group('gloo')\n"
                    + reduce + "\n(x.item(), os.environ['WORLD_SIZE'])") == (3.0, "2")
        # Made again twice in one cell, rank 0 the last to destroy its group each time: rank 1
        # must not find rank 0's old store, still up there (it would read the old group's
        # addresses, and rank 0's new store would wait for it for 30 minutes). Rank 0 destroys
        # its group once the test has seen rank 1, its own destroyed, waiting in
        # init_process_group (the files say where each rank got to).
        code = (f"import time\nfolder = {str(tmp_path)!r}\nrank, seen = dist.get_rank(), []\n"
                "for i in range(2):\n"
                "    while rank == 0 and not os.path.exists(f'{folder}/go-{i}'):\n"
                "        time.sleep(0.02)\n"
                "    dist.destroy_process_group()\n"
                "    open(f'{folder}/destroyed-{rank}-{i}', 'w').close()\n"
                "    dist.init_process_group('gloo')\n"
                "    open(f'{folder}/joined-{rank}-{i}', 'w').close()\n"
                "    x = torch.tensor([dist.get_rank() + 1.0])\n    dist.all_reduce(x)\n"
                "    seen.append((os.environ['MASTER_PORT'], x.item()))\nseen")
        run = ip.run_cell_magic("horovod", "--quiet --background", code)
        for i in range(2):
            stack = rank_1_in_init_process_group(run, tmp_path, i)
            # (torch makes the group's Gloo in _new_process_group_helper, once it has a store)
            assert stack and "in _new_process_group_helper" not in stack, \
                f"rank 1 found rank 0's old store (its group {i} under way): {stack}"
            (tmp_path / f"go-{i}").write_text("")
        for seen in run.wait(120):
            assert [value for _, value in seen] == [3.0, 3.0] and seen[0][0] != seen[1][0], seen
    finally:
        ip.run_line_magic("horovod_session", "stop")


def rank_1_in_init_process_group(run, folder, i, timeout=120):
    """Rank 1's stack once it is seen in init_process_group, its group destroyed (it wrote
    `destroyed-1-i`); None if it made the new one first (`joined-1-i`). Rank 0 keeps its old
    group, and the old store, until the test writes `go-i`."""
    deadline = time.monotonic() + timeout
    while not (folder / f"destroyed-1-{i}").exists():
        assert run.state == "running" and time.monotonic() < deadline, \
            f"rank 1 never destroyed its group {i}: {run.state}, {run.error}, {rank_1_at(run)}"
        time.sleep(0.05)
    while not (folder / f"joined-1-{i}").exists():
        stack = rank_1_at(run)
        if re.search(r'line \d+, in init_process_group\n', stack):
            return stack
        assert run.state == "running" and time.monotonic() < deadline, (run.state, stack)
        time.sleep(0.05)
    return None


def rank_1_at(run):
    """Rank 1's whole stack now (or why there is none)."""
    try:
        return run.stacks().get(1, "")
    except RuntimeError as exc:  # the run has ended
        return str(exc)


DDP_SCRIPT = """\
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(x)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        f.write(str(x.item()))
dist.destroy_process_group()
"""


def test_a_ddp_script_through_the_magic_and_the_terminal(ip, tmp_path):
    (tmp_path / "train.py").write_text(DDP_SCRIPT)
    ip.run_line_magic("horovod", f"--np -2 --quiet {tmp_path}/train.py {tmp_path}/magic.txt")
    assert (tmp_path / "magic.txt").read_text() == "3.0"
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "hvd_magic", "-np", "-2", "train.py",
                           "terminal.txt"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "terminal.txt").read_text() == "3.0"


def test_horovod_runner_runs_a_ddp_function(ip, fresh_ns):
    ip.run_cell("from hvd_magic import HorovodRunner\n"
                "def total(scale):\n"
                "    import torch, torch.distributed as dist\n"
                "    dist.init_process_group('gloo')\n"
                "    x = torch.tensor([dist.get_rank() + 1.0])\n"
                "    dist.all_reduce(x)\n"
                "    return (dist.get_rank(), x.item() * scale)\n"
                "result = HorovodRunner(np=-2, quiet=True).run(total, scale=2.0)\n").raise_error()
    assert fresh_ns["result"] == (0, 6.0)
    assert hvd_magic.last_run().results == [(0, 6.0), (1, 6.0)]


def test_a_sigkilled_rank_ends_the_run_and_is_named(ip):
    cell = ("import os, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "if dist.get_rank() == 1:\n"
            "    os.kill(os.getpid(), 9)\n"
            "dist.all_reduce(torch.ones(1))  # rank 0 waits here for the dead rank\n")
    with pytest.raises(hvd_magic.RankError) as info:  # not RunTimeout, nor Gloo's 30 minutes
        ip.run_cell_magic("horovod", "--np -2 --quiet --timeout 120", cell)
    assert info.value.rank == 1 and "SIGKILL" in str(info.value)
    assert hvd_magic.last_run().state == "failed"


def test_a_rank_that_killed_itself_before_the_stop_came_is_named(ip, tmp_path):
    """The order of a fresh-clone run: rank 1 SIGKILLs itself, rank 0's collective fails at once
    and the run stops every rank, before rank 1's task has told how its rank ended. It was
    named "stopped" then, and rank 0's follow-on error the cause. Here a process rank 1 started
    in a session of its own holds rank 1's output open, so its task waits for the end of that
    output while the stop comes."""
    holder = tmp_path / "holder.pid"
    cell = ("import os, subprocess, sys, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "if dist.get_rank() == 1:\n"
            "    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
            "                         start_new_session=True)\n"
            f"    open({str(holder)!r}, 'w').write(str(p.pid))\n"
            "    os.kill(os.getpid(), 9)\n"
            "dist.all_reduce(torch.ones(1))\n")
    try:
        with pytest.raises(hvd_magic.RankError) as info:
            ip.run_cell_magic("horovod", "--np -2 --quiet --timeout 120", cell)
        run = hvd_magic.last_run()
        with open(os.path.join(run.run_dir, "events.jsonl")) as f:
            exits = {e["rank"]: e for e in map(json.loads, f) if e.get("t") == "exit"}
        # the order this test is for: rank 0's failure (which stops the run) told first
        assert run.stop_reason == "failed" and exits[0]["time"] < exits[1]["time"]
        assert info.value.rank == 1 and "killed by SIGKILL" in str(info.value)
        assert exits[1]["status"] == "died"
    finally:
        if holder.exists():
            os.kill(int(holder.read_text()), 9)


class _UntoldEnd:
    """A rank whose end its template has not told yet (the order of the test above, as a
    loaded machine gave it: the stop came while the dead rank was an unreaped zombie)."""

    def __init__(self, pid):
        self.pid = pid

    def poll(self):
        return None

    def wait(self, timeout=None):
        time.sleep(timeout)
        raise subprocess.TimeoutExpired("rank", timeout)


def test_a_stop_that_finds_the_rank_already_dead_sends_it_nothing():
    from hvd_magic.task.stopping import ended_by, stop_group

    rank = subprocess.Popen(["sleep", "60"], start_new_session=True)
    os.kill(rank.pid, signal.SIGKILL)  # its own death; left unreaped, as a template does a while
    with open(f"/proc/{rank.pid}/stat") as f:
        while f.seek(0) == 0 and f.read().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.01)
    sent = set()
    stop_group(_UntoldEnd(rank.pid), grace=0.2, sent=sent)
    assert sent == set() and not ended_by(-signal.SIGKILL, sent)  # its end is its own
    assert rank.wait() == -signal.SIGKILL
    alive = subprocess.Popen(["sleep", "60"], start_new_session=True)
    sent = set()
    stop_group(alive, grace=5, sent=sent)
    assert sent == {signal.SIGTERM} and ended_by(alive.wait(), sent)  # the stop's own end


# Rank 0 takes one step more than rank 1, which then goes on with other work: rank 0 waits in a
# collective rank 1 never calls (in DDP's backward: its reducer's all-reduce of the gradients).
STALLS = {
    "all_reduce": "for step in range(3 if dist.get_rank() == 0 else 2):\n"
                  "    dist.all_reduce(torch.ones(2))\n",
    # an asynchronous collective returns at once: rank 0 waits in its work's wait()
    "Work.wait": "for step in range(3 if dist.get_rank() == 0 else 2):\n"
                 "    dist.all_reduce(torch.ones(2), async_op=True).wait()\n",
    "backward": "from torch.nn.parallel import DistributedDataParallel\n"
                "ddp = DistributedDataParallel(torch.nn.Linear(2, 1))\n"
                "for step in range(3 if dist.get_rank() == 0 else 2):\n"
                "    ddp(torch.ones(4, 2)).sum().backward()\n",
}


@pytest.mark.parametrize("op", sorted(STALLS))
def test_the_watchdog_names_a_rank_stuck_in_a_torch_collective(ip, op):
    cell = ("import time, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
            + STALLS[op] + "if dist.get_rank() == 1:\n    time.sleep(120)\n")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet --stall-timeout 3 --on-stall fail", cell)
    text = "\n".join(info.value._render_traceback_())
    assert f"rank 0 has been waiting in a collective ({op})" in text, text
    assert "rank 1 is running elsewhere" in text


def test_rank_0_keeps_the_store_until_every_rank_is_done_with_it(ip, tmp_path):
    """Rank 0's process hosts torch.distributed's store: a cell that ends with no collective
    after making its group must not take the store away from a peer still using it (the peer
    failed with "Connection reset by peer" when rank 0's process ended first). Rank 1 uses the
    store once rank 0's cell has ended, and rank 0 has either exited or waits for it (in
    `hvd_magic.rank.torch_store.release`): the test writes the file rank 1 waits for."""
    cell = ("import os, time, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "if dist.get_rank() == 1:\n"
            "    while not os.path.exists('go'):  # (in the notebook's folder)\n"
            "        time.sleep(0.05)\n"
            "    store = dist.distributed_c10d._get_default_store()\n"
            "    store.set('late', 'still here')\n"
            "    assert store.get('late') == b'still here'\n"
            "dist.get_world_size()\n")
    run = ip.run_cell_magic("distributed", "--np -2 --quiet --background", cell)
    waits = re.compile(r'torch_store\.py", line \d+, in release\n')
    deadline = time.monotonic() + 120
    while run.state == "running" and run.ranks[0].exit is None and \
            not waits.search(run.stacks().get(0, "")):
        assert time.monotonic() < deadline, run.stacks().get(0)
        time.sleep(0.1)
    (tmp_path / "go").write_text("")
    assert run.wait(60) == [2, 2]


def test_distributed_is_horovod_under_another_name(ip):
    cell = "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.get_world_size()"
    assert ip.run_cell_magic("distributed", "--np -2 --quiet", cell) == 2
    assert hvd_magic.last_run().results == [2, 2]
    help_text = ip.find_cell_magic("distributed").__doc__
    assert help_text == ip.find_cell_magic("horovod").__doc__  # the same options and help
    assert "torch.distributed" in help_text and "%%distributed" in help_text
    with pytest.raises(UsageError, match="--np"):
        ip.run_cell_magic("distributed", "--np two", cell)


def test_the_watchdog_names_a_rank_missing_from_init_process_group(ip):
    cell = ("import os, time, torch.distributed as dist\n"
            "if os.environ['RANK'] == '1':\n    time.sleep(120)\n"
            "dist.init_process_group('gloo')\n")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet --stall-timeout 3 --on-stall fail", cell)
    text = "\n".join(info.value._render_traceback_())
    assert "rank 0 has been waiting in dist.init_process_group() for" in text, text
    assert "rank 1, which has not called it" in text

