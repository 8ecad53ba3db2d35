"""hvd_magic in a user's own environment: installed by pip from the project's wheel where Horovod
was never installed (`own_env`), and where pyspark is not either. Every way in runs code that
does not use Horovod; what needs Horovod or pyspark says so before anything starts.

Each environment's steps run in one Python process of its own (`own_env_steps.py`, a real
IPython shell), one JSON line a step.
"""

import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

STEPS_WITHOUT_HOROVOD = ["where", "ddp_driver", "ddp_spark", "data", "run_function", "lightning",
                         "torch_distributor", "torch_distributor_local", "session",
                         "horovod_driver", "horovod_spark", "horovod_runner", "timeline",
                         "elastic"]
STEPS_WITHOUT_PYSPARK = ["where", "ddp_driver", "torch_distributor_local", "session", "ddp_spark",
                         "pyspark_loaded"]


def run_steps(python, steps, cwd):
    out = subprocess.run([python, os.path.join(os.path.dirname(__file__), "own_env_steps.py"),
                          *steps], cwd=cwd, capture_output=True, text=True, timeout=400)
    outcomes = {}
    for line in out.stdout.splitlines():
        if line.startswith('{"step"'):
            outcome = json.loads(line)
            outcomes[outcome["step"]] = outcome
    assert list(outcomes) == steps, out.stdout[-3000:] + out.stderr[-3000:]
    return outcomes


@pytest.fixture(scope="module")
def without_horovod(env_without_horovod, tmp_path_factory):
    return run_steps(env_without_horovod, STEPS_WITHOUT_HOROVOD,
                     tmp_path_factory.mktemp("no-horovod"))


@pytest.fixture(scope="module")
def without_pyspark(env_without_pyspark, tmp_path_factory):
    return run_steps(env_without_pyspark, STEPS_WITHOUT_PYSPARK,
                     tmp_path_factory.mktemp("no-pyspark"))


def value(outcome):
    assert "error" not in outcome, outcome.get("traceback")
    return outcome["value"]


def one_process_ddp_weights():
    """What DDP's one step must give: one process, the same start, both ranks' batches."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x = torch.cat([torch.randn(8, 4, generator=torch.Generator().manual_seed(r)) for r in (0, 1)])
    model(x).pow(2).mean().backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    return model.weight.detach().flatten().tolist()


def test_the_environment_is_a_users_without_horovod(env_without_horovod, without_horovod):
    env = os.path.dirname(os.path.dirname(env_without_horovod))
    assert value(without_horovod["where"]).startswith(env)  # the wheel's hvd_magic, not ours
    probe = subprocess.run([env_without_horovod, "-c", "import horovod"], capture_output=True,
                           text=True)
    assert "No module named 'horovod'" in probe.stderr
    assert os.access(os.path.join(env, "bin", "hvd-run"), os.X_OK)  # the wheel's console script


@pytest.mark.parametrize("step", ["ddp_driver", "ddp_spark"])
def test_a_ddp_cell_trains_on_both_launchers_without_horovod(without_horovod, step):
    outcome = value(without_horovod[step])
    assert outcome["where"] == "driver only" if step == "ddp_driver" else \
        outcome["where"].startswith("local[")
    expected = one_process_ddp_weights()
    assert len(outcome["results"]) == 2
    for world, weights in outcome["results"]:
        assert world == 2
        assert weights == pytest.approx(expected, abs=1e-6)


def test_lightning_fits_without_horovod(without_horovod):
    results = value(without_horovod["lightning"])["results"]
    torch.manual_seed(0)
    start = torch.nn.Linear(4, 1).weight.detach().flatten().tolist()
    (world0, weights0), (world1, weights1) = results
    assert world0 == world1 == 2
    assert weights0 == weights1  # each rank its own batches: equal only if DDP averaged them
    assert weights0 != pytest.approx(start, abs=1e-3)  # and it moved


def test_a_torch_cells_timeline_without_horovod(without_horovod):
    """--timeline of DDP code records torch's profile on every rank: no Horovod needed."""
    assert value(without_horovod["timeline"])["file"] == "timeline-ranks.json.gz"


def test_the_other_ways_in_without_horovod(without_horovod):
    assert value(without_horovod["run_function"]) == [3.0, 3.0]
    assert value(without_horovod["torch_distributor"]) == 3.0           # on Spark
    assert value(without_horovod["torch_distributor_local"]) == 3.0     # on the driver
    assert value(without_horovod["session"]) == 3.0                     # a warm session
    ranks, shares, totals = zip(*value(without_horovod["data"])["results"])   # --data df
    assert ranks == (0, 1) and sum(shares) == 100 and min(shares) > 0 and totals == (100, 100)


@pytest.mark.parametrize("step, needed_by", [
    ("horovod_driver", "This cell imports horovod.torch"),
    ("horovod_spark", "This cell imports horovod.torch"),   # a local session: this Python
    ("horovod_runner", "This function imports horovod.torch"),  # HorovodRunner(np=-2).run(f)
    ("elastic", "--min-np")])
def test_what_needs_horovod_says_so_before_anything_starts(env_without_horovod, without_horovod,
                                                           step, needed_by):
    outcome = without_horovod[step]
    assert outcome.get("error") == "UsageError", outcome
    message = outcome["message"]
    assert message.startswith(needed_by)
    assert "needs Horovod, which is not installed in this notebook's Python" in message
    assert os.path.normpath(env_without_horovod) in message
    assert "python -m hvd_magic.build_horovod" in message


def test_driver_only_ranks_need_no_pyspark(env_without_pyspark, without_pyspark):
    probe = subprocess.run([env_without_pyspark, "-c", "import pyspark"], capture_output=True,
                           text=True)
    assert "No module named 'pyspark'" in probe.stderr
    outcome = value(without_pyspark["ddp_driver"])
    assert [weights for _, weights in outcome["results"]] == \
        [pytest.approx(one_process_ddp_weights(), abs=1e-6)] * 2
    assert value(without_pyspark["torch_distributor_local"]) == 3.0
    assert value(without_pyspark["session"]) == 3.0
    assert value(without_pyspark["pyspark_loaded"]) == []


def test_spark_ranks_without_pyspark_say_what_to_do(without_pyspark):
    outcome = without_pyspark["ddp_spark"]
    assert outcome.get("error") == "UsageError", outcome
    assert "needs pyspark, which is not installed" in outcome["message"]
    assert "pip install pyspark" in outcome["message"]
    assert "--np -2" in outcome["message"]


def test_a_script_runs_from_the_wheels_hvd_run(env_without_pyspark, tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)\n"
        "print(f'sum {t.item()} on rank {dist.get_rank()}')\n")
    hvd_run = os.path.join(os.path.dirname(env_without_pyspark), "hvd-run")
    out = subprocess.run([hvd_run, "-np", "-2", "train.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[rank 0] sum 3.0 on rank 0" in out.stdout
    assert "[rank 1] sum 3.0 on rank 1" in out.stdout


def test_the_template_holds_only_what_is_installed(env_without_horovod):
    """A job that imports Horovod where it is not installed: the host's template holds torch for
    it, not a Horovod import that would fail there (the rank's own import says what is wrong)."""
    asked = subprocess.run(
        [env_without_horovod, "-c", "from hvd_magic.template import wanted\n"
         "print(wanted({'imports': ['horovod.torch', 'torch', 'pandas']}))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert asked == "['numpy', 'pandas', 'torch']"


def test_executors_lacking_a_module_with_the_notebooks_own_path_are_not_told_to_change_it():
    """Spark's workers ran this very interpreter's path (on executors whose copy of the
    environment lacks Horovod): the message names the module and that Python, not
    PYSPARK_PYTHON, which would change nothing."""
    import sys

    from hvd_magic.launch.spark_errors import java_message

    failure = RuntimeError("org.apache.spark.api.python.PythonException: Traceback (most recent "
                           "call last):\nModuleNotFoundError: No module named 'horovod'\n")
    message = java_message(failure, workers_python=sys.executable)
    assert "PYSPARK_PYTHON" not in message
    assert f"needs Horovod, which is not installed in the executors' Python ({sys.executable}" \
        in message
    assert "python -m hvd_magic.build_horovod" in message
    other = java_message(failure, workers_python="/usr/bin/python3")  # another interpreter
    assert f"Set PYSPARK_PYTHON={sys.executable}" in other
