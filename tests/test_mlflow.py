"""MLflow: a run's params, rank 0's metrics, its files and status, read back with MlflowClient
from a real tracking server (``mlflow server``, SQLite store) and from a ``file:`` store."""

import os
import sys

import pytest
from IPython.core.error import UsageError

import hvd_magic
from conftest import spark_session, start_mlflow_server

mlflow = pytest.importorskip("mlflow")

CELL = """\
import mlflow
import horovod.torch as hvd
import hvd_magic
hvd.init()
for step in range(1, 6):
    hvd_magic.report(step=step, total=5, loss=1.0 / step)
if hvd.rank() == 0:
    mlflow.log_metric("from_rank_0", 7.0, step=3)  # lands in the notebook's run
hvd.rank()
"""

FAILING = """\
import sys
import torch, horovod.torch as hvd
import hvd_magic
hvd.init()
hvd_magic.report(step=1, accuracy=0.5)
hvd.allreduce(torch.ones(1))  # rank 0 reported before rank 1 fails
if hvd.rank() == 1:
    sys.exit(3)
"""


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """``mlflow server`` on a free port with a SQLite store; its artifacts served by it."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    server, url = start_mlflow_server(tmp, tmp / "server.log")
    try:
        yield url
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.fixture
def tracking(request):
    """The tracking URI a test asks for, set for its duration."""
    before = mlflow.get_tracking_uri()
    yield lambda uri: mlflow.set_tracking_uri(uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(before)


def _artifacts(client, run_id, path=""):
    found = []
    for item in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def test_a_cell_logs_to_the_notebooks_active_run_on_a_tracking_server(
        ip, tracking_server, tracking, tmp_path):
    tracking(tracking_server)
    spark_session(2)
    client = mlflow.MlflowClient()
    with mlflow.start_run() as active:
        ip.run_cell_magic("horovod", "--np 2 --text --name tracked", CELL)
        run = hvd_magic.last_run()
        logged = client.get_run(active.info.run_id)
        assert logged.info.status == "RUNNING"  # the notebook's own run: left to the notebook
    params = logged.data.params
    assert params["np"] == "2" and params["launcher"].startswith("local[")
    assert params["name"] == "tracked" and params["hosts"]
    assert params["horovod_version"] == "0.28.1" and params["torch_version"].startswith("2.")
    assert logged.data.tags["hvd_magic.status"] == "FINISHED"
    history = client.get_metric_history(active.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / s) for s in range(1, 6)]
    assert [(m.step, m.value) for m in client.get_metric_history(active.info.run_id, "from_rank_0")] \
        == [(3, 7.0)]
    files = _artifacts(client, active.info.run_id)
    folder = f"hvd_magic/{run.id}"
    for name in ("cell.py", "run/rank-0.log", "run/rank-1.log", "run/events.jsonl", "run/run.json"):
        assert f"{folder}/{name}" in files
    cell = client.download_artifacts(active.info.run_id, f"{folder}/cell.py", str(tmp_path))
    assert "from_rank_0" in open(cell).read()


def test_a_failing_script_ends_its_own_run_failed(ip, tracking_server, tracking, tmp_path):
    tracking(tracking_server)
    (tmp_path / "fails.py").write_text(FAILING)
    with pytest.raises(hvd_magic.RankError):
        ip.run_line_magic("horovod", "--np -2 --quiet --mlflow fails.py --some arg")
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("Default")
    [logged] = client.search_runs([experiment.experiment_id], "params.script = 'fails.py'")
    assert logged.info.status == "FAILED"
    assert "fails.py exited with code 3" in logged.data.tags["hvd_magic.error"]
    assert logged.data.params["script_args"] == "--some arg"
    assert [m.value for m in client.get_metric_history(logged.info.run_id, "accuracy")] == [0.5]
    files = _artifacts(client, logged.info.run_id)
    assert f"hvd_magic/{hvd_magic.last_run().id}/fails.py" in files


def test_every_ranks_system_metrics_under_mlflows_own_names(ip, tracking_server, tracking):
    tracking(tracking_server)
    cell = ("import os, time\nif os.environ['RANK'] == '1':\n"
            "    ballast = b'x' * (100 << 20)\ntime.sleep(2.5)\n")  # (a sample a second)
    ip.run_cell_magic("horovod", "--np -2 --quiet --mlflow", cell)
    client = mlflow.MlflowClient()
    [logged] = client.search_runs([client.get_experiment_by_name("Default").experiment_id],
                                  order_by=["attributes.start_time DESC"], max_results=1)
    metrics = logged.data.metrics
    for rank in (0, 1):
        for name in ("cpu_utilization_percentage", "system_memory_usage_megabytes",
                     "system_memory_usage_percentage"):
            assert f"system/rank_{rank}/{name}" in metrics, sorted(metrics)
    assert metrics["system/rank_1/system_memory_usage_megabytes"] > \
        metrics["system/rank_0/system_memory_usage_megabytes"] + 80  # (its 100 MB, in MB)


def test_a_file_store_and_an_experiment_by_name(tracking, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file: stores opt-in
    tracking(f"file:{tmp_path}/mlruns")
    (tmp_path / "steps.py").write_text(
        "import hvd_magic\nfor i in range(300):\n    hvd_magic.report(step=i, x=float(i))\n")
    run = hvd_magic.run_script("steps.py", np=-2, mlflow="scripts")
    client = mlflow.MlflowClient()
    [logged] = client.search_runs([client.get_experiment_by_name("scripts").experiment_id])
    assert logged.info.status == "FINISHED"
    history = client.get_metric_history(logged.info.run_id, "x")
    assert [(m.step, m.value) for m in history] == [(i, float(i)) for i in range(300)]
    assert f"hvd_magic/{run.id}/run/rank-1.log" in _artifacts(client, logged.info.run_id)


def test_without_mlflow_nothing_is_logged_and_asking_for_it_says_how(ip, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` fails, as if not installed
    with pytest.raises(UsageError, match=r"pip install 'hvd_magic\[mlflow\]'"):
        ip.run_cell_magic("horovod", "--np -2 --mlflow", "1")
    ip.run_cell_magic("horovod", "--np -2 --quiet", "import os\nos.environ.get('MLFLOW_RUN_ID', 'none')")
    assert hvd_magic.last_run().results == ["none", "none"]
