"""Debugging from the notebook, on real ranks: every rank's stack on demand (grouped), a rank
stuck in C code holding the GIL still answering, and the failing rank's frames in ``%debug``."""

import io
import os
import re
import sys
import threading
import time

import pytest

import hvd_magic
from hvd_magic.driver.stack_groups import Stacks, rank_ranges

SLEEPER_AND_ALLREDUCE = """
import time, torch, horovod.torch as hvd
hvd.init()
def load_batch(batch_id):
    time.sleep(120)
if hvd.rank() == 1:
    load_batch(7)
hvd.allreduce(torch.ones(2), name="grad")
"""


def stacks_when(run, *words, timeout=120):
    """The run's stacks once every word is in their grouped view (the ranks start slowly)."""
    deadline = time.monotonic() + timeout
    while True:
        stacks = run.stacks()
        if all(w in stacks.text() for w in words) or time.monotonic() > deadline:
            return stacks
        time.sleep(0.5)


def cancel(run):
    run.cancel()
    with pytest.raises(hvd_magic.RunCancelled):
        run.wait(60)


@pytest.mark.parametrize("np", [-2, 2])
def test_a_sleeping_rank_and_one_in_an_allreduce_give_both_stacks(ip, np):
    run = ip.run_cell_magic("horovod", f"--np {np} --background --quiet", SLEEPER_AND_ALLREDUCE)
    try:
        stacks = stacks_when(run, "load_batch", "→ allreduce")
        text = stacks.text()
        assert "rank 0: Cell In[" in text and "→ allreduce" in text, text
        assert "rank 1: Cell In[" in text and "in load_batch" in text, text
        assert "load_batch" in stacks[1] and "allreduce" in stacks[0]  # the mapping: whole text
        # the user's frame's locals came along: load_batch's argument
        main = next(t for t in stacks.threads[1] if t["main"])
        i = next(i for i, f in enumerate(main["frames"]) if f[2] == "load_batch")
        assert main["locals"][str(i)]["batch_id"] == ["v", 7]
        # the magic asks the running run
        assert isinstance(ip.run_line_magic("horovod_stacks", ""), Stacks)
    finally:
        cancel(run)
    with open(os.path.join(run.run_dir, "stacks.txt")) as f:  # kept when it was cancelled
        assert "load_batch" in f.read()
    assert "load_batch" in str(ip.run_line_magic("horovod_stacks", ""))  # the last run's, kept


SLEEPER_AND_DIST_ALL_REDUCE = """
import time, torch, torch.distributed as dist
dist.init_process_group('gloo')
def load_batch(batch_id):
    time.sleep(120)
for step in range(3):
    dist.all_reduce(torch.ones(2))
if dist.get_rank() == 1:
    load_batch(7)
dist.all_reduce(torch.ones(2))
"""


def test_ddp_a_sleeping_rank_and_one_in_dist_all_reduce_give_both_stacks(ip):
    pytest.importorskip("torch")
    run = ip.run_cell_magic("horovod", "--np -2 --background --quiet", SLEEPER_AND_DIST_ALL_REDUCE)
    try:
        stacks = stacks_when(run, "in load_batch", "→ all_reduce")
    finally:
        cancel(run)
    text = stacks.text()
    assert "rank 0: Cell In[" in text and "→ all_reduce" in text, text  # blocked in Gloo's C++
    assert "rank 1: Cell In[" in text and "in load_batch" in text, text
    assert stacks.how.get(0) == "python" and not stacks.missing
    # where each is in its collectives, from torch's Flight Recorder: rank 1 one behind
    where = re.search(r"in collectives \(torch's Flight Recorder\): rank 0 at #(\d+) "
                      r"gloo:all_reduce; rank 1 at #(\d+) gloo:all_reduce \(behind\)", text)
    assert where and int(where[1]) == int(where[2]) + 1, text


def test_eight_ranks_read_as_two_groups(ip):
    cell = ("import os, time\n"
            "def wait_for_peers():\n"
            "    time.sleep(120)\n"
            "def read_shard():\n"
            "    time.sleep(120)\n"
            "if os.environ['HOROVOD_RANK'] == '5':\n"
            "    read_shard()\n"
            "else:\n"
            "    wait_for_peers()\n")
    run = ip.run_cell_magic("horovod", "--np -8 --background --quiet", cell)
    try:
        stacks = stacks_when(run, "ranks 0-4, 6-7: Cell In[", "rank 5: Cell In[")
        # the dashboard's Stacks button shows the same groups
        from IPython.utils.capture import capture_output
        from hvd_magic.view.dashboard import Dashboard
        view = Dashboard()
        with capture_output():
            view.start(run)  # (a background run's view shows at once)
        view.stacks.button.click()
        shown = view.stacks.html.value
        assert "ranks 0-4, 6-7" in shown and "read_shard" in shown and "rank 5" in shown, shown
    finally:
        cancel(run)
    text = stacks.text()
    assert "ranks 0-4, 6-7: Cell In[" in text and ", in wait_for_peers" in text, text
    assert "rank 5: Cell In[" in text and ", in read_shard" in text, text
    assert len(stacks.groups()) == 2 and len(stacks) == 8 and not stacks.missing


def test_a_rank_holding_the_gil_in_c_code_still_gives_its_stack(ip):
    # A regular expression that backtracks for ages: the `re` engine (C) holds the GIL the
    # whole time, so no Python thread of the rank can run; faulthandler answers.
    cell = ("import os, re, time\n"
            "def backtrack():\n"
            "    re.match(r'(a+)+$', 'a' * 64 + 'b')\n"
            "if os.environ['HOROVOD_RANK'] == '1':\n"
            "    backtrack()\n"
            "time.sleep(120)\n")
    run = ip.run_cell_magic("horovod", "--np -2 --background --quiet", cell)
    try:
        stacks = stacks_when(run, "in backtrack")
    finally:
        cancel(run)
    assert stacks.how.get(1) == "faulthandler", stacks.text()
    assert "rank 1: Cell In[" in stacks.text() and "→ match" in stacks.text(), stacks.text()
    assert stacks.how.get(0) == "python" and not stacks.missing


def test_horovod_debug_with_no_rank_held_says_how_to_hold_one(ip):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--debug"):
        ip.run_line_magic("horovod_debug", "")


def test_a_rank_not_yet_listening_is_named_not_killed(tmp_path):
    """A rank process asked before it registered its handler (still starting): the signal's
    default action would end it, so it is not sent; the rank is reported as not answering."""
    import subprocess
    import types

    from hvd_magic.task.stacks import StackProbe

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    read_end, write_end = os.pipe()
    sent = []
    probe = StackProbe(proc, write_end, str(tmp_path / "stacks.dump"),
                       types.SimpleNamespace(send=sent.append))
    try:
        probe.request(1)
        assert [(e["id"], e["how"]) for e in sent] == [("1", None)], sent
        assert "did not answer" in sent[0]["error"]
        assert proc.poll() is None  # alive
    finally:
        proc.kill()
        proc.wait()
        probe.close()
        os.close(read_end)
    # ... and the driver names it among the missing, beside a rank that answered
    from hvd_magic.driver.stacks import StackRequest

    run = types.SimpleNamespace(id="r", ranks=[types.SimpleNamespace(rank=r, exit=None, pid=r + 1)
                                               for r in (0, 1)])
    request = StackRequest(run, 2.0)
    request.add(0, {"threads": [{"name": "MainThread", "main": True, "frames": [], "locals": {}}],
                    "how": "python"})
    request.add(1, sent[0])
    assert request.complete() and request.result().missing == {1: sent[0]["error"]}


def test_rank_ranges():
    assert rank_ranges([3]) == "rank 3"
    assert rank_ranges([7, 0, 1, 2, 4, 5, 6]) == "ranks 0-2, 4-7"


def test_a_rank_that_answers_without_frames_is_named():
    from types import SimpleNamespace
    from hvd_magic.driver.stacks import StackRequest

    run = SimpleNamespace(id="r", ranks=[SimpleNamespace(rank=r, exit=None, pid=1) for r in (0, 1)])
    request = StackRequest(run, timeout=5)
    request.add(1, {"threads": [], "error": "the rank did not answer"})
    assert request.result().missing == {1: "the rank did not answer", 0: "no answer within 5.0 s"}


def test_locals_travel_as_themselves_or_as_bounded_reprs():
    import numpy as np
    from hvd_magic.rank.frames import bounded

    assert bounded(3) == ["v", 3] and bounded({"lr": 0.1}) == ["v", {"lr": 0.1}]
    assert bounded((1, "a")) == ["t", [1, "a"]]
    assert bounded(list(range(10**6)))[0] == "r"  # never encoded whole
    assert bounded(np.zeros((3, 4))) == ["r", "ndarray(shape=(3, 4), dtype=float64, "
                                              "[0.0, 0.0, 0.0, 0.0, ...])"]

    class OnAGpu:  # its values would wait for a CUDA stream: shape and dtype only
        shape, dtype, device = (2,), "float32", "cuda:0"

    assert bounded(OnAGpu()) == ["r", "OnAGpu(shape=(2,), dtype=float32, device=cuda:0)"]


def test_what_debug_may_ask_of_a_local_is_bounded():
    import json

    import numpy as np
    from hvd_magic.driver.rank_locals import standin
    from hvd_magic.rank.frames import described

    huge = described(np.zeros((10**4, 10**3)))  # its first values only: 32 of 10**7
    assert huge[2]["shape"] == [10**4, 10**3] and len(huge[2]["first"]) == 32
    nested = described({f"k{i}": list(range(10**5)) for i in range(1000)})
    assert nested[2]["len"] == 1000 and len(nested[2]["items"]) == 20
    assert len(json.dumps(nested)) < 20_000  # items one level down, with fewer of their own

    class OnAGpu:  # shape, dtype and device; its values would wait for a CUDA stream
        shape, dtype, device = (2,), "float32", "cuda:0"

    x = standin(described(OnAGpu()), "x", 3)
    assert x.shape == (2,) and x.device == "cuda:0"
    with pytest.raises(IndexError, match=r"x\[0\] was not sent from rank 3 .*only its shape"):
        x[0]


FAILING = """
import numpy as np
def scale_batch(batch, factor):
    weights = np.arange(12.0).reshape(3, 4)
    return sum(batch) / (factor - 2)
def train_step(step):
    batch = [step, step + 1, step + 2]
    return scale_batch(batch, 2)
import os
if os.environ['HOROVOD_RANK'] == '1':
    train_step(5)
"""


def test_debug_after_a_rank_failed_opens_its_frames_with_their_locals(ip, capsys, monkeypatch):
    ip.InteractiveTB.pdb = None  # made anew: it reads the stdin given below
    monkeypatch.setattr(sys, "stdin", io.StringIO("%pdb on\n"))
    ip.run_line_magic("pdb", "on")
    try:
        # %pdb on: the debugger opens as the error is shown, at the failing rank's frame
        monkeypatch.setattr(sys, "stdin", io.StringIO("p factor\np weights\nup\np batch\nq\n"))
        ip.run_cell("%%horovod --np -2 --quiet\n" + FAILING)
    finally:
        ip.run_line_magic("pdb", "off")
    out = capsys.readouterr().out
    assert "scale_batch()" in out and "ZeroDivisionError" in out, out
    assert "\n2\n" in out.replace("ipdb> ", "\n"), out                      # factor
    assert "ndarray(shape=(3, 4), dtype=float64, [0.0, 1.0" in out, out  # weights, bounded
    assert "[5, 6, 7]" in out, out                                        # the caller's batch

    # %debug later: the same frames; `where` goes up to the cell
    ip.InteractiveTB.pdb = None
    monkeypatch.setattr(sys, "stdin", io.StringIO("where\nup\np step\nq\n"))
    ip.run_line_magic("debug", "")
    out = capsys.readouterr().out
    assert "train_step()" in out and "<module>()" in out and "\n5\n" in out.replace("ipdb> ", "\n"), out

    error = hvd_magic.last_run().error
    assert [f.name for f in error.frames] == ["<module>", "train_step", "scale_batch"]
    assert error.frames[-1].locals["factor"] == 2


SHAPES = """
import os, torch, numpy as np
def forward(rank):
    x = torch.arange(12.0).reshape(3, 4)
    a = np.zeros((2, 5))
    d = {"lr": 0.1, "w": torch.ones(2)}
    batch = list(range(100))
    big = torch.zeros(100, 100)
    if rank == 1:
        raise RuntimeError(f"shapes cannot be multiplied: {tuple(x.shape)} and (5, 2)")
forward(int(os.environ['HOROVOD_RANK']))
"""

SHAPE_QUESTIONS = {  # what a person debugging a shape error asks, and what the rank's value says
    "p x.shape": "torch.Size([3, 4])", "p x.dtype": "torch.float32", "p x.ndim": "2",
    "p len(x)": "3", "p x.size()": "torch.Size([3, 4])", "p x.size(1)": "4",
    "p x[0]": "Tensor(shape=(4,), dtype=torch.float32, [0.0, 1.0, 2.0, 3.0])",
    "p x[:2].shape": "torch.Size([2, 4])", "p x[1, 2]": "6.0", "p x[:, 0].tolist()": "[0.0, 4.0, 8.0]",
    "p a.shape": "(2, 5)", "p a.dtype": "float64", "p a.size": "10",
    "p len(d)": "2", "p list(d)": "['lr', 'w']", "p d['lr']": "0.1", "p d['w'].shape": "torch.Size([2])",
    "p len(batch)": "100", "p batch[:3]": "[0, 1, 2]", "p big.shape": "torch.Size([100, 100])",
    "p x.foo": "*** AttributeError: x.foo was not sent from rank 1 (x is a torch.Tensor there: "
               "only its shape, dtype, device and all 12 of its values came back)",
    "p big[7]": "*** IndexError: big[7] was not sent from rank 1 (big is a torch.Tensor there: "
                "only its shape, dtype, device and first 32 values came back)",
    "p batch[50]": "*** IndexError: batch[50] was not sent from rank 1 (batch is a list there: "
                   "only its length (100) and its first 20 items came back)",
    "p d['nope']": "*** KeyError: 'nope'",   # every key came: it is not there
    "p x + 1": "*** TypeError: x + ... is not computed in %debug: x is a torch.Tensor on rank 1",
}


def test_debug_answers_shapes_dtypes_lengths_and_items_of_the_ranks_values(
        ip, capsys, monkeypatch):
    pytest.importorskip("torch")
    ip.run_cell("%%horovod --np -2 --quiet\n" + SHAPES)
    capsys.readouterr()
    ip.InteractiveTB.pdb = None  # made anew: it reads the stdin given below
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(SHAPE_QUESTIONS) + "\nq\n"))
    ip.run_line_magic("debug", "")
    out = capsys.readouterr().out
    answers = [a.strip() for a in out.split("ipdb> ")[1:len(SHAPE_QUESTIONS) + 1]]
    for (question, expected), answer in zip(SHAPE_QUESTIONS.items(), answers):
        assert answer.startswith(expected), (question, answer, out)
    assert "Shown" not in out and "rank_locals" not in out, out

    x = hvd_magic.last_run().error.frames[-1].locals["x"]  # the same stand-ins, for code
    assert x.shape == (3, 4) and x[2].tolist() == [8.0, 9.0, 10.0, 11.0]


NAMED = """
import os, time
class ShapeError(Exception):
    pass
class Model:
    def __init__(self):
        self.width = 4
def check(model):
    if os.environ['HOROVOD_RANK'] == '1':
        raise ShapeError(f"width {model.width}")
check(Model())
"""


def test_a_cell_has_one_name_and_its_wrapper_none_in_what_a_person_reads(ip, capsys, monkeypatch):
    # the traceback and the error's headline
    ip.run_cell("%%horovod --np -2 --quiet\n" + NAMED)
    shown = capsys.readouterr().out  # as the notebook shows it
    assert "ShapeError: width 4" in shown and "Cell In[" in shown, shown
    assert "__cell__" not in shown and "hvd_magic_cell" not in shown, shown
    # the debugger's frame lines, `where`, and the values' reprs
    error = hvd_magic.last_run().error
    cell = error.frames[0].filename
    assert cell.startswith("<Cell In[") and all(f.filename == cell for f in error.frames)
    ip.InteractiveTB.pdb = None
    monkeypatch.setattr(sys, "stdin", io.StringIO("where\np model\np model.width\nup\np check\nq\n"))
    ip.run_line_magic("debug", "")
    out = capsys.readouterr().out
    assert f"{cell}(10)check()" in out and f"{cell}(11)<module>()" in out, out
    assert "<Model object at" in out and "<function check at" in out, out
    assert "\n4\n" in out.replace("ipdb> ", "\n"), out  # model.width
    assert "hvd_magic cell" not in out and "__cell__" not in out, out
    # the stacks of a running cell, and their locals (the dashboard's Stacks panel)
    run = ip.run_cell_magic("horovod", "--np -2 --background --quiet",
                            NAMED.replace("raise ShapeError", "time.sleep(120); raise ShapeError"))
    try:
        stacks = stacks_when(run, "in check")
    finally:
        cancel(run)
    text, panel = stacks.text(), stacks._repr_html_()
    assert "rank 1: Cell In[" in text and ", in check" in text, text
    assert "hvd_magic cell" not in text + panel and "__cell__" not in text + panel, panel
    assert "&lt;Model object at" in panel, panel


def test_a_warm_sessions_cell_gives_its_stacks_and_its_failing_frames(ip, fresh_ns):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        asked = {}

        def ask_while_it_runs():  # what a Stacks click does while the cell runs
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "stacks" not in asked:
                run = hvd_magic.last_run()
                if run is not None and run.state == "running":
                    stacks = run.stacks()
                    if "in nap" in stacks.text():
                        asked["stacks"] = stacks
                        run.cancel()
                time.sleep(0.2)

        helper = threading.Thread(target=ask_while_it_runs)
        helper.start()
        with pytest.raises(hvd_magic.RunCancelled):
            ip.run_cell_magic("horovod", "--quiet", "import time\ndef nap():\n    time.sleep(120)\nnap()\n")
        helper.join()
        assert "ranks 0-1: Cell In[" in asked["stacks"].text(), asked["stacks"].text()
        with pytest.raises(hvd_magic.RankError) as info:
            ip.run_cell_magic("horovod", "--quiet", "def f(n):\n    return 1 / (n - n)\nf(3)\n")
        assert info.value.frames[-1].name == "f" and info.value.frames[-1].locals["n"] == 3
        assert ip.run_cell_magic("horovod", "--quiet", "6 * 7") == 42  # the session goes on
    finally:
        ip.run_line_magic("horovod_session", "stop")


def test_hvd_run_pdb_opens_the_failing_ranks_frames(tmp_path):
    import subprocess
    script = tmp_path / "train.py"
    script.write_text("import os\n"
                      "def step(learning_rate):\n"
                      "    raise ValueError(f'diverged at {learning_rate}')\n"
                      "if os.environ['HOROVOD_RANK'] == '1':\n"
                      "    step(0.5)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(hvd_magic.__file__)))
    done = subprocess.run([sys.executable, "-m", "hvd_magic", "--np", "-2", "--pdb", "--quiet",
                           str(script)], input="p learning_rate\nup\nq\n", capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)
    assert "diverged at 0.5" in done.stderr, done.stderr
    assert "step()" in done.stdout and "\n0.5\n" in done.stdout.replace("(Pdb) ", "\n"), done.stdout
    assert "<module>()" in done.stdout, done.stdout


def test_a_session_rank_held_at_its_exception_is_inspected_and_released(ip, capsys, monkeypatch):
    ip.run_line_magic("horovod_session", "start --np -2 --debug")
    try:
        # a foreground cell: rank 1 stops at its exception and the cell opens its pdb at once
        monkeypatch.setattr(sys, "stdin", io.StringIO("p factor\nup\np batch\np sum(batch) * 2\nc\n"))
        with pytest.raises(hvd_magic.RankError) as info:  # released: the cell ends with its error
            ip.run_cell_magic("horovod", "--quiet", FAILING)
        out = capsys.readouterr().out
        assert "rank 1 stopped: ZeroDivisionError" in out, out
        assert "scale_batch()" in out, out
        assert "<Cell In[" in out and "hvd_magic cell" not in out, out  # as %debug names it
        values = out.replace("(Pdb) ", "\n").splitlines()
        assert "2" in values and "[5, 6, 7]" in values and "36" in values, out  # live values
        assert info.value.rank == 1 and "ZeroDivisionError" in str(info.value)

        # a background cell: %horovod_debug drives the held rank
        run = ip.run_cell_magic("horovod", "--quiet --background", FAILING)
        deadline = time.monotonic() + 120
        while not run.held() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(run.held()) == [1]
        monkeypatch.setattr(sys, "stdin", io.StringIO("where\np weights.shape\nq\n"))
        ip.run_line_magic("horovod_debug", "")
        out = capsys.readouterr().out
        assert "train_step()" in out and "(3, 4)" in out, out
        with pytest.raises(hvd_magic.RankError):
            run.wait(60)
        assert ip.run_cell_magic("horovod", "--quiet", "6 * 7") == 42  # the session goes on
    finally:
        ip.run_line_magic("horovod_session", "stop")


# rank 0 stops in pdb with `loss` (1.5 + its rank) in its frame; the cell's value is `loss`
STOPS_AT_A_BREAKPOINT = ("import hvd_magic, os\n"
                         "def step(rank):\n"
                         "    loss = 1.5 + rank\n"
                         "    hvd_magic.breakpoint()\n"
                         "    return loss\n"
                         "step(int(os.environ['HOROVOD_RANK']))\n")


def test_a_breakpoint_stops_one_session_rank(ip, fresh_ns, capsys, monkeypatch):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        monkeypatch.setattr(sys, "stdin", io.StringIO("p loss\nloss = 0.25\nc\n"))
        cell = STOPS_AT_A_BREAKPOINT
        value = ip.run_cell_magic("horovod", "--quiet", cell)
        out = capsys.readouterr().out
        assert "rank 0 stopped: hvd_magic.breakpoint() on rank 0" in out, out
        assert "1.5" in out.replace("(Pdb) ", "\n").splitlines(), out
        assert value == 0.25  # set in pdb, on the live frame
        assert ip.run_cell_magic("horovod", "--quiet", "6 * 7") == 42
    finally:
        ip.run_line_magic("horovod_session", "stop")


# Rank 1 goes on to the collective once it has been told that rank 0 is held (the driver's
# "hold", through its task: `hvd_magic.rank.debugger`), not before: else it could be inside the
# framework's collective already, where the hold cannot reach it.
TOLD = ("if {rank} == 1:\n"
        "    from hvd_magic.rank import debugger\n"
        "    while debugger._go.is_set():  # (cleared by the hold)\n"
        "        time.sleep(0.05)\n")
HELD_CELLS = {
    "horovod": ("import time, hvd_magic, torch, horovod.torch as hvd\n"
                "hvd.init()\n"
                "hvd_magic.breakpoint()  # rank 0 stops; rank 1 goes on to the allreduce\n"
                + TOLD.format(rank="hvd.rank()") +
                "hvd.allreduce(torch.ones(1), name='after', op=hvd.Sum).item()\n"),
    "ddp": ("import time, hvd_magic, torch, torch.distributed as dist\n"
            "if not dist.is_initialized():\n"
            "    dist.init_process_group('gloo')\n"
            "hvd_magic.breakpoint()  # rank 0 stops; rank 1 goes on to the all_reduce\n"
            + TOLD.format(rank="dist.get_rank()") +
            "total = torch.ones(1)\n"
            "dist.all_reduce(total)  # Gloo's own wait would count the debugging\n"
            "total.item()\n"),
}


@pytest.mark.parametrize("framework", sorted(HELD_CELLS))
def test_while_a_rank_is_held_the_others_wait_on_our_channel_not_in_a_collective(
        ip, capsys, monkeypatch, framework):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        cell = HELD_CELLS[framework]
        run = ip.run_cell_magic("horovod", "--quiet --background", cell)
        deadline = time.monotonic() + 120
        while not run.held() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(run.held()) == [0]
        while "in wait_while_held" not in run.stacks().get(1, "") and time.monotonic() < deadline:
            time.sleep(0.2)  # (rank 1's whole stack: the grouped view folds hvd_magic's frames)
        stacks = run.stacks()
        assert "in wait_while_held" in stacks[1], stacks[1]
        assert "in synchronize" not in stacks[1] and "in all_reduce" not in stacks[1], stacks[1]
        monkeypatch.setattr(sys, "stdin", io.StringIO("c\n"))
        ip.run_line_magic("horovod_debug", "")
        assert run.wait(60) == [2.0, 2.0]  # let go: both met in the allreduce
    finally:
        ip.run_line_magic("horovod_session", "stop")


def test_stopping_the_session_while_a_rank_is_held_leaves_nothing_running(ip):
    import psutil

    ip.run_line_magic("horovod_session", "start --np -2")
    session = ip.find_line_magic("horovod_session").__self__.session
    pids = [session.ranks[r]["pid"] for r in range(2)]
    run = ip.run_cell_magic("horovod", "--quiet --background",
                            "import hvd_magic\nhvd_magic.breakpoint(rank=None)\n")
    deadline = time.monotonic() + 120
    while len(run.held()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(run.held()) == [0, 1]  # rank=None: every rank
    ip.run_line_magic("horovod_session", "stop")
    try:  # (the end of input quit pdb: the cell may have ended, or been stopped)
        run.wait(60)
    except hvd_magic.HorovodMagicError:
        pass
    assert run.state != "running" and not run.held()
    gone = psutil.wait_procs([p for p in map(_process, pids) if p], timeout=30)[1]
    assert not gone, gone  # every rank process ended


def _process(pid):
    import psutil
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def test_a_held_rank_that_dies_is_named_not_waited_on(ip, capsys, monkeypatch):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        run = ip.run_cell_magic("horovod", "--quiet --background",
                                "import hvd_magic\nhvd_magic.breakpoint(rank=1)\n")
        deadline = time.monotonic() + 120
        while not run.held() and time.monotonic() < deadline:
            time.sleep(0.1)
        # the command itself ends the rank: it never answers
        monkeypatch.setattr(sys, "stdin", io.StringIO("import os; os.kill(os.getpid(), 9)\n"))
        ip.run_line_magic("horovod_debug", "--rank 1")
        assert "rank 1 ended while held in pdb" in capsys.readouterr().out
        with pytest.raises(hvd_magic.HorovodMagicError):
            run.wait(60)
    finally:
        ip.run_line_magic("horovod_session", "stop")


# pdb's own commands that let a rank go or leave pdb: not random input (they are the release);
# and an alias, which could name one
_RESUMING = {"c", "cont", "continue", "q", "quit", "exit", "EOF", "n", "next", "s", "step", "r",
             "return", "unt", "until", "j", "jump", "run", "restart", "debug", "interact",
             "alias"}


def _pdb_commands(line):
    """The commands pdb reads in `line`: each ";;"-separated part's leading identifier (pdb's
    own parse: "c.x" and "c\tx" are "c")."""
    import string
    chars = string.ascii_letters + string.digits + "_"
    commands = []
    for part in line.split(";;"):
        part = part.strip()
        end = 0
        while end < len(part) and part[end] in chars:
            end += 1
        commands.append(part[:end])
    return commands


def test_a_held_ranks_channel_fed_random_frames_and_commands_stays_up(ip, fresh_ns):
    """The debugger's channel fuzzed (hypothesis) while rank 0 of a session cell is held in pdb:
    a peer with the session's token sends ``debug`` events of every wrong shape and cut-off
    frames, and the person types random lines into pdb. Each line gets pdb's answer; the rank
    stays held, still answers ``p loss`` from its live frame, and ``c`` lets it go with the
    cell's values; the session's next cell runs."""
    import socket
    import struct

    from hypothesis import HealthCheck, given, settings, strategies as st

    from hvd_magic.driver.debugger import PROMPT
    from hvd_magic.events import EventClient, encode_frame

    ip.run_line_magic("horovod_session", "start --np -2")
    session = ip.magics_manager.registry["HorovodMagics"].session
    try:
        cell = STOPS_AT_A_BREAKPOINT
        run = ip.run_cell_magic("horovod", "--quiet --background", cell)
        deadline = time.monotonic() + 120
        while not run.held() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(run.held()) == [0]
        answers = run._debug_queue(0)

        def answer(line):
            """pdb's answer to `line` (what it printed up to its next prompt)."""
            run.debug_command(0, line)
            text = ""
            while not text.endswith(PROMPT):
                event = answers.get(timeout=60)
                assert event.get("state") == "prompt", event  # never let go
                text += str(event.get("text") or "")
            return text

        while not answers.empty():  # (its first prompt)
            answers.get()
        server = session.server
        client = EventClient(server.address, server.token)
        junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=40),
                         st.lists(st.integers(), max_size=3))
        fields = {"rank": st.one_of(junk, st.integers(min_value=2), st.integers(max_value=-1)),
                  "state": junk, "text": junk, "why": junk, "cmd": junk}

        @settings(max_examples=25, deadline=None, database=None,  # (about a minute)
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(st.fixed_dictionaries({}, optional=fields), st.binary(max_size=64),
               st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")),
                       max_size=60))  # (one line: no line or paragraph separator)
        def fuzzed(event, cut, line):
            client.send(dict(event, t="debug"))  # no held rank's, or of no shape pdb's side knows
            host, port = server.address.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                # a peer with the token whose frame is cut off
                sock.sendall(encode_frame({"token": server.token})
                             + struct.pack("!I", len(cut) + 10) + cut)
            if not set(_pdb_commands(line)) & _RESUMING and \
                    not any(c.lstrip().startswith(("!", "import", "os", "sys"))
                            for c in line.split(";;")):
                answer(line)
            assert run.state == "running" and list(run.held()) == [0]

        fuzzed()
        assert "1.5" in answer("p loss").replace(PROMPT, "\n").splitlines()
        run.debug_command(0, "c")
        assert run.wait(60) == [1.5, 2.5]
        client.close()
        assert ip.run_cell_magic("horovod", "--quiet", "6 * 7") == 42
    finally:
        ip.run_line_magic("horovod_session", "stop")
