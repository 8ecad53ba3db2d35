"""What the ranks send back at the end and the notebook cannot read (a value of a class only the
ranks can rebuild, a CUDA tensor and no GPU here, a profile that is no profile) ends the run with
an error naming the rank and the cause: its state final, its view finished, nothing left held.
Real runs on the driver (``--np -2``), through the API and a real IPython shell."""

import json
import os
import pickle
import pickletools
import subprocess
import sys
import threading
import types

import pytest

import hvd_magic
from hvd_magic.compat import torch as torch_compat
from hvd_magic.view import TextView

from conftest import spark_session
from test_failures import our_children, rank_processes_left
from test_timeline_ranks import DETAIL_CELL

# A value whose unpickling raises in the notebook alone: its class's __reduce__ names a function
# of the cell that only a rank's environment lets through (cloudpickle ships both by value).
ONLY_ON_RANKS = """\
import os

def rebuild():
    if "HOROVOD_RANK" not in os.environ:
        raise ValueError("only a rank can rebuild this")
    return "rebuilt"

class OnlyOnRanks:
    def __reduce__(self):
        return rebuild, ()
"""


def only_on_rank_1():
    """A function whose rank 1 returns such a value (nested: cloudpickle ships it by value)."""
    def value():
        import os
        cell = {}
        exec(ONLY_ON_RANKS, cell)
        return cell["OnlyOnRanks"]() if os.environ["HOROVOD_RANK"] == "1" else 42
    return value


class FinishSeen(TextView):
    """A quiet text view that counts its `finish` calls."""

    def __init__(self):
        super().__init__(quiet=True)
        self.finished = 0

    def finish(self, run):
        self.finished += 1
        super().finish(run)


def assert_ended(run, view=None):
    """The run ended failed, its view finished once, its ranks and threads gone."""
    assert run.state == "failed" and run._done.is_set(), run.state
    assert [r.state for r in run.ranks] == ["done"] * run.np  # (they did finish)
    with open(os.path.join(run.run_dir, "run.json")) as f:
        assert json.load(f)["state"] == "failed"
    if view is not None:
        assert view.finished == 1
    assert rank_processes_left(run) == [] and our_children() == []


@pytest.mark.parametrize("np", [-2, 2], ids=["driver", "spark"])
def test_a_value_the_notebook_cannot_read_ends_the_run_naming_the_rank(np):
    if np > 0:
        spark_session(2)
    threads = set(threading.enumerate())
    view = FinishSeen()
    with pytest.raises(hvd_magic.RankError) as caught:  # (without the fix: ValueError, "running")
        hvd_magic.run(only_on_rank_1(), np=np, view=view, timeout=120)
    error, run = caught.value, hvd_magic.last_run()
    assert isinstance(error, hvd_magic.ResultError) and error.rank == 1
    text = "\n".join(error._render_traceback_())
    assert "rank 1 on " in text and "its value could not be read in this notebook" in text
    assert "ValueError: only a rank can rebuild this" in text
    assert "in rebuild" in text  # where it failed: the value's own code, not hvd_magic's
    assert "rank 0: finished" in text
    assert run.error is error and run.results is None
    assert_ended(run, view)
    assert {t for t in threading.enumerate() if t.name.startswith("hvd")} - threads == set()


def test_a_cells_value_or_export_the_notebook_cannot_read_ends_the_cell(ip, fresh_ns):
    cell = ONLY_ON_RANKS + "thing = OnlyOnRanks()\n7"
    with pytest.raises(hvd_magic.ResultError) as caught:
        ip.run_cell_magic("horovod", "--np -2 --quiet --export thing", cell)
    text = "\n".join(caught.value._render_traceback_())
    assert "rank 0 on " in text and "ValueError: only a rank can rebuild this" in text
    assert "(or its --export thing)" in text
    assert "thing" not in fresh_ns
    assert_ended(hvd_magic.last_run())

    with pytest.raises(hvd_magic.ResultError, match="rank 0 on .* could not be read"):
        ip.run_cell_magic("horovod", "--np -2 --quiet", ONLY_ON_RANKS + "OnlyOnRanks()")
    assert_ended(hvd_magic.last_run())


def test_a_background_runs_value_the_notebook_cannot_read_ends_it(ip):
    run = ip.run_cell_magic("horovod", "--np -2 --quiet --background",
                            ONLY_ON_RANKS + "OnlyOnRanks()")
    with pytest.raises(hvd_magic.ResultError, match="rank 0 on "):
        run.wait(120)
    assert_ended(run)


def test_a_session_cells_value_the_notebook_cannot_read_keeps_the_session(ip, fresh_ns):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        with pytest.raises(hvd_magic.ResultError, match="rank 0 on .* could not be read"):
            ip.run_cell_magic("horovod", "--quiet", ONLY_ON_RANKS + "OnlyOnRanks()")
        run = hvd_magic.last_run()
        assert run.state == "failed" and run._done.is_set()
        assert ip.run_cell_magic("horovod", "--quiet", "6 * 7") == 42  # the ranks are fine
    finally:
        ip.run_line_magic("horovod_session", "stop")


# A GPU rank's tensor, without a GPU: torch's own serialization (its public register_package)
# made to tag every storage of the rank "cuda:0", as a CUDA tensor's is. Unpickled in a notebook
# without CUDA, plain torch says "Attempting to deserialize object on a CUDA device".
def cuda_tensor_of_a_gpu_rank():
    def value():
        import torch
        torch.serialization.register_package(0, lambda storage: "cuda:0",
                                             lambda storage, at: None)
        return {"weights": torch.arange(6.0).reshape(2, 3), "step": 3}
    return value


def test_a_cuda_tensor_comes_back_to_a_notebook_without_a_gpu_on_the_cpu(capsys):
    torch = pytest.importorskip("torch")
    assert not torch.cuda.is_available()
    run = hvd_magic.run(cuda_tensor_of_a_gpu_rank(), np=-2, view=TextView(), timeout=120)
    assert run.state == "done", run.error
    for value in run.results:
        assert value["step"] == 3 and value["weights"].device.type == "cpu"
        assert torch.equal(value["weights"], torch.arange(6.0).reshape(2, 3))
    said = capsys.readouterr().out
    assert said.count("held CUDA tensors") == 1, said
    assert "[hvd_magic] The values of 2 ranks (0, 1) held CUDA tensors, and this notebook has " \
           "no GPU: they came back as CPU tensors." in said


def test_where_torchs_storages_cannot_be_mapped_to_the_cpu_the_error_says_how_to_return_them(
        monkeypatch):
    pytest.importorskip("torch")
    from hvd_magic.driver import results

    monkeypatch.setattr(torch_compat, "storage_loader_on_cpu", lambda *args: None)
    view = FinishSeen()
    with pytest.raises(hvd_magic.ResultError) as caught:
        hvd_magic.run(cuda_tensor_of_a_gpu_rank(), np=-2, view=view, timeout=120)
    text = "\n".join(caught.value._render_traceback_())
    assert "rank 0 on " in text and "RuntimeError: Attempting to deserialize object on a CUDA" \
        in text
    assert "holds CUDA tensors and this notebook has no GPU" in text and "tensor.cpu()" in text
    assert_ended(hvd_magic.last_run(), view)


def test_the_storage_loader_substituted_is_the_one_torchs_tensors_pickle_with():
    """The private name `compat.torch.storage_loader_on_cpu` replaces is the one this torch's tensors
    name in their pickles (a torch that renamed it fails here first)."""
    torch = pytest.importorskip("torch")
    names = [arg for op, arg, _ in pickletools.genops(pickle.dumps(torch.ones(2), protocol=2))
             if op.name == "GLOBAL"]
    assert "torch.storage _load_from_bytes" in names, names


# Rank 1 spoils its own profile once torch's profiler wrote it (a thread writes it, whole, after
# the window's end: rank/profile.py), before the rank ends and its task sends the file back.
SPOILED_PROFILE = DETAIL_CELL + """\
import json, os, time
path = json.loads(os.environ["HVD_MAGIC_PROFILE"])["path"]
if os.environ["HOROVOD_RANK"] == "1":
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(path)
    with open(path, "w") as f:
        f.write("{not a profile")
int(os.environ["HOROVOD_RANK"])
"""


def test_a_profile_the_notebook_cannot_read_ends_the_run_naming_the_rank(ip):
    with pytest.raises(hvd_magic.ResultError) as caught:
        ip.run_cell_magic("horovod", "--np -2 --quiet --timeline-steps 2:3", SPOILED_PROFILE)
    text = "\n".join(caught.value._render_traceback_())
    assert "rank 1 on " in text and "its profile could not be read in this notebook" in text
    assert "JSONDecodeError" in text
    run = hvd_magic.last_run()
    assert run.results == [0, 1]  # the values are not lost with the profile
    assert_ended(run)


def test_a_rank_only_module_is_named_with_what_to_do(tmp_path):
    """The value of a class from a module the ranks import and the notebook cannot."""
    from hvd_magic.driver.ranks import RankState
    from hvd_magic.driver.results import collect, unreadable_error

    (tmp_path / "ranks_only.py").write_text("class Model:\n    pass\n")
    made = subprocess.run(
        [sys.executable, "-c", "import pickle, sys, ranks_only; "
                               "sys.stdout.buffer.write(pickle.dumps(ranks_only.Model()))"],
        cwd=tmp_path, capture_output=True, check=True).stdout
    got = collect([(0, "ok", pickle.dumps(1)), (1, "ok", made)], 2, False)
    assert got.results == [1, None] and [u.rank for u in got.unreadable] == [1]
    run = types.SimpleNamespace(id="r", np=2, ranks=[RankState(0), RankState(1)], cell=None,
                                run_dir=str(tmp_path), results=None)
    text = str(unreadable_error(run, got.unreadable))
    assert "rank 1 finished, but its value could not be read in this notebook: " \
           "ModuleNotFoundError: No module named 'ranks_only'" in text
    assert "Rank 1's value is of a class this notebook cannot import" in text


def test_a_bug_while_ending_the_run_still_ends_it(monkeypatch):
    """Whatever fails while the end is read (here: a bug made in reading the timeline), the run
    ends failed with an InternalError, its view finished."""
    from hvd_magic.driver import ending

    def broken(run):
        raise RuntimeError("a bug at the end")

    monkeypatch.setattr(ending, "timeline_of", broken)
    view = FinishSeen()
    with pytest.raises(hvd_magic.InternalError, match="while ending the run: RuntimeError: a bug"):
        hvd_magic.run(only_on_rank_1(), np=-2, view=view, timeout=120)
    run = hvd_magic.last_run()
    assert_ended(run, view)
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        assert "a bug at the end" in f.read()  # its traceback, where the message says


def test_an_interrupt_while_the_values_are_read_ends_the_run_cancelled():
    """A value whose unpickling is interrupted (here: it raises KeyboardInterrupt in the notebook,
    as Ctrl-C in the middle of a large one would)."""
    def interrupted_here():
        import os

        def rebuild():
            if "HOROVOD_RANK" not in os.environ:
                raise KeyboardInterrupt
            return "rebuilt"

        class Interrupted:
            def __reduce__(self):
                return rebuild, ()

        return Interrupted()

    view = FinishSeen()
    with pytest.raises(hvd_magic.RunCancelled, match="cancelled while its values were read"):
        hvd_magic.run(interrupted_here, np=-2, view=view, timeout=120)
    run = hvd_magic.last_run()
    assert run.state == "cancelled" and view.finished == 1 and run._done.is_set()
