"""Elastic runs whose ranks raise end with the ranks' own error (`RankError`, the failing rank's
traceback), as a run that is not elastic does: on one rank or on every rank, before, inside or
after `hvd.elastic.run`; on the driver and on Spark; a function, a cell, a script (`run_script`,
`hvd-run`) and an elastic session's cell. Real rank processes, real Horovod elastic.

The elastic-timeout error, kept for what it names (too few ranks for too long, with the run's own
seconds and lost ranks), is tested in test_elastic.py.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import hvd_magic
from hvd_magic.errors import RankError
from hvd_magic.view import TextView

from conftest import ROOT, spark_session

# The training a user writes for Horovod's elastic API, with a bug on the ranks in `raisers`
# at `where` ("before" the elastic loop, "inside" it at step 6, or "after" it). Its free names:
# where, raisers.
TRAINING = """\
import horovod.torch as hvd
import torch

hvd.init()
if where == "before" and hvd.rank() in raisers:
    raise ValueError(f"a typo before the loop on rank {hvd.rank()}")
state = hvd.elastic.TorchState(step=0)

@hvd.elastic.run
def train(state):
    while state.step < 10:
        hvd.allreduce(torch.tensor([1.0]))
        state.step += 1
        if where == "inside" and state.step == 6 and hvd.rank() in raisers:
            raise ValueError(f"a typo inside the loop on rank {hvd.rank()}")
        if state.step % 5 == 0:
            state.commit()

train(state)
if where == "after" and hvd.rank() in raisers:
    raise ValueError(f"a typo after the loop on rank {hvd.rank()}")
state.step
"""


def _assert_the_ranks_error(error, where, raisers):
    """`error` is the own ValueError of a rank in `raisers` (Horovod ranks), raised `where`, its
    traceback shown, not an elastic timeout. (`error.rank` is the view's row: in an elastic run
    a slot, whatever Horovod rank its process got.)"""
    assert isinstance(error, RankError), repr(error)
    text = "\n".join(error._render_traceback_())
    assert error.rank in (0, 1), text
    raised = re.search(rf"ValueError: a typo {where} the loop on rank (\d)", text)
    assert raised and int(raised.group(1)) in raisers, text
    assert f'raise ValueError(f"a typo {where} the loop on rank {{hvd.rank()}}")' in text
    assert f"--- traceback of rank {error.rank}" in text
    assert "elastic timeout" not in text and "--min-np" not in text
    return text


def _spark(np):
    if np > 0:
        spark_session(4)  # the shared embedded session: slots are plain tasks there


@pytest.mark.parametrize("np", [-2, 2], ids=["driver", "spark"])
def test_every_rank_raising_before_the_elastic_loop_is_their_error(np):
    """The issue's own case: a function that calls hvd.init(), then has a bug on every rank
    before its elastic loop. (Nested: pickled by value, the ranks cannot import this module.)"""
    def raise_before_the_loop():
        import horovod.torch as hvd
        hvd.init()
        raise ValueError(f"a typo before the loop on rank {hvd.rank()}")

    _spark(np)
    with pytest.raises(RankError) as caught:
        hvd_magic.run(raise_before_the_loop, np=np, min_np=2, view=TextView(quiet=True))
    _assert_the_ranks_error(caught.value, "before", [0, 1])
    run = hvd_magic.last_run()
    assert run.state == "failed" and not run.unended()
    # the other rank's line is its own error, or "stopped" where the first error stopped it before
    # it raised (a machine under load); never lost, and no rank was lost
    other = caught.value.others[1 - caught.value.rank]
    assert other == "stopped" or "ValueError: a typo before the loop on rank" in other, other
    assert not [c for c in run.membership if c["t"] in ("lost", "joined")]


@pytest.mark.parametrize("np", ["-2", "2"], ids=["driver", "spark"])
@pytest.mark.parametrize("where, raisers", [("inside", [1]), ("after", [0, 1]), ("after", [1])],
                         ids=["inside-one", "after-all", "after-one"])
def test_ranks_raising_in_or_after_the_elastic_loop_of_a_cell_are_its_error(
        ip, fresh_ns, np, where, raisers):
    _spark(int(np))
    fresh_ns.update(where=where, raisers=raisers)
    with pytest.raises(RankError) as caught:
        ip.run_cell_magic("horovod", f"--np {np} --min-np 2 --quiet", TRAINING)
    _assert_the_ranks_error(caught.value, where, raisers)
    run = hvd_magic.last_run()
    assert run.state == "failed" and not run.unended()
    assert not [c for c in run.membership if c["t"] in ("lost", "joined")]


SCRIPT = """\
import sys

where, raisers = sys.argv[1], [int(r) for r in sys.argv[2].split(",")]
""" + TRAINING.replace("state.step\n", "print('trained', state.step)\n")


def _line_of(where):
    """The line of SCRIPT that raises `where`."""
    return 1 + next(i for i, line in enumerate(SCRIPT.splitlines())
                    if f"a typo {where} the loop" in line)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train_elastic.py"
    path.write_text(SCRIPT)
    return path


def test_a_script_whose_ranks_raise_in_an_elastic_run_shows_their_error(script):
    with pytest.raises(RankError) as caught:
        hvd_magic.run_script(str(script), args=["before", "0,1"], np=-2, min_np=2,
                             view=TextView(quiet=True))
    _assert_the_ranks_error(caught.value, "before", [0, 1])
    assert f'File "{script}", line {_line_of("before")}, in <module>' in str(caught.value)


def test_hvd_run_of_an_elastic_script_whose_rank_raises_prints_its_error(script):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run(
        [sys.executable, "-m", "hvd_magic", "-np", "-2", "--min-np", "2", "--elastic-timeout",
         "30", "-q", str(script), "inside", "1"],
        capture_output=True, text=True, timeout=300, env=env, cwd=script.parent)
    assert done.returncode == 1, done.stderr
    assert re.search(r"RankError: rank \d on \S+ failed: ValueError: a typo inside the loop on "
                     r"rank 1", done.stderr), done.stderr
    assert f'File "{script}", line {_line_of("inside")}, in train' in done.stderr
    assert "elastic timeout" not in done.stderr


SESSION_CELL = textwrap.dedent("""\
    import torch, horovod.torch as hvd
    hvd.init()
    step = 0
    while step < 5:
        hvd.allreduce(torch.tensor([1.0]))
        step += 1
    if hvd.rank() in raisers:
        raise ValueError(f"a typo after the loop on rank {hvd.rank()}")
""")


def test_a_cell_of_an_elastic_session_whose_ranks_raise_shows_their_error(ip, fresh_ns):
    ip.run_line_magic("horovod_session", "start --np -2 --min-np 2")
    session = ip.magics_manager.registry["HorovodMagics"].session
    try:
        for raisers in ([1], [0, 1]):
            fresh_ns["raisers"] = raisers
            with pytest.raises(RankError) as caught:
                ip.run_cell_magic("horovod", "--quiet", SESSION_CELL)
            _assert_the_ranks_error(caught.value, "after", raisers)
        # the session goes on: a bug in a cell loses no rank
        assert ip.run_cell_magic("horovod", "--quiet", "hvd.size()") == 2
        assert session.broken is None and not session.lost
    finally:
        ip.run_line_magic("horovod_session", "stop")
