"""Lightning and accelerate in a %%horovod cell, on real ranks: they see the launched world and
start no process of their own; a spawning strategy or a world mismatch says what to write; a
LightningModule's self.log values and the fit's progress reach the dashboard and MLflow."""

import json
import os
import re

import pytest

import hvd_magic
from hvd_magic.view.charts import series
from hvd_magic.view.table import table_html

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

# Each rank's own rows, seeded by its rank: the cells define it on the ranks, the references here.
ROWS = """\
import torch
def rank_rows(rank):
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(rank))
    return x, x.sum(1, keepdim=True)
"""
_here = {}
exec(ROWS, _here)
rank_rows = _here["rank_rows"]


def one_process_on_every_ranks_batches(batches):
    """What DDP promises: one model from the ranks' start (seed 0), trained with plain SGD on
    the ranks' batches of each step together; `batches(rank)` lists a rank's (x, y), in order.
    The weight before and after."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    start = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in zip(*(batches(rank) for rank in (0, 1))):
        x, y = (torch.cat(part) for part in zip(*step))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return start, model.weight.detach()


def assert_trained_as_one_process(weights, batches):
    """Every rank's weight moved from the start to one process's on every rank's batches."""
    start, expected = one_process_on_every_ranks_batches(batches)
    for rank, weight in enumerate(map(torch.tensor, weights)):
        assert not torch.allclose(weight, start, atol=1e-3), f"rank {rank}'s weight never moved"
        assert torch.allclose(weight, expected, atol=1e-6), (rank, weight, expected)


def lightning_batches(rank):
    """A training fit's DistributedSampler (Lightning's, shuffling: seed 0 + epoch) gives rank r
    every other row of its own 32 from the r-th, in a shuffled order: 2 batches of 8 an epoch."""
    x, y = rank_rows(rank)
    batches = []
    for epoch in range(2):
        rows = torch.randperm(32, generator=torch.Generator().manual_seed(epoch))[rank::2]
        batches += [(x[rows[i:i + 8]], y[rows[i:i + 8]]) for i in (0, 8)]
    return batches


MODULE = ROWS + """\
import os
import psutil, torch, torch.distributed as dist
import lightning as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same start on every rank
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

x, y = rank_rows(int(os.environ["RANK"]))
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
"""

FIT = """\
model = Tiny()
trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices={devices}, num_nodes=1,
                    max_epochs=2, log_every_n_steps=1, enable_checkpointing=False, logger=False,
                    enable_model_summary=False, callbacks=[L.pytorch.callbacks.TQDMProgressBar()])
trainer.fit(model, data)
weights = model.layer.weight.detach()
every = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
dist.all_gather(every, weights)
(type(trainer.strategy.cluster_environment).__name__, trainer.world_size,
 [w.tolist() for w in every], psutil.Process().children(recursive=True))
"""


def _progress(run):
    """Each rank's progress events, as (step, total), from the run's events.jsonl."""
    seen = {}
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        for event in map(json.loads, f):
            if event.get("t") == "progress":
                seen.setdefault(event["rank"], []).append((event["step"], event["total"]))
    return seen


@pytest.mark.parametrize("line", ["--np -2", "--np 2"])  # on the driver; on Spark local
def test_lightning_fits_on_the_ranks_with_equal_weights_metrics_and_progress(ip, line):
    env, world, weights, children = ip.run_cell_magic(
        "horovod", f"{line} --quiet", MODULE + FIT.format(devices=2))
    assert (env, world, children) == ("TorchElasticEnvironment", 2, [])  # no process of its own
    assert_trained_as_one_process(weights, lightning_batches)  # DDP averaged their gradients
    run = hvd_magic.last_run()
    # self.log's only: not the epoch Lightning adds to each log (no chart of it either)
    assert set(run.metrics.name) == {"loss"} and set(series(run.ranks)) == {"loss"}
    loss = run.metrics[run.metrics.name == "loss"]
    table = table_html(run, [[], []])  # the rows of the dashboard, and of its static rendition
    for rank in (0, 1):  # 16 rows a rank, batches of 8, 2 epochs: 4 steps logged, from 0
        logged = loss[loss["rank"] == rank].sort_values("step")
        assert list(logged.step) == [0, 1, 2, 3]
        # The row ends with the fit's last values (its last event said only the step)
        last = logged.value.iloc[-1]
        assert run.ranks[rank].metrics == {"loss": pytest.approx(last)}
        row = re.search(f"<tr data-rank='{rank}'.*?</tr>", table).group(0)
        assert f">loss={last:.4g}<" in row
        progress = _progress(run)[rank]
        assert progress[-1] == (4, 4)  # the fit's 4 steps, done
        assert {total for _, total in progress} == {4}  # the fit's steps, from the start
        assert run.ranks[rank].step == run.ranks[rank].total == 4


def test_lightnings_tensorboard_logger_leaves_tensorflow_unloaded_unless_the_cell_uses_it(
        ip, tmp_path, monkeypatch):
    """Lightning's default logger (TensorBoard's, on rank 0) writes its events where it always
    does, without TensorFlow loaded on the rank (TensorBoard's stub: ~500 MB less), unless the
    cell imports TensorFlow itself."""
    pytest.importorskip("tensorflow")  # (where it is not installed, TensorBoard uses its stub)
    monkeypatch.chdir(tmp_path)
    fit = FIT.format(devices=2).replace(", logger=False", "").replace(
        "children(recursive=True))", "children(recursive=True), 'tensorflow' in sys.modules)")
    for imports in ("import sys\n", "import sys, tensorflow\n"):
        *_, loaded = ip.run_cell_magic("horovod", "--np -2 --quiet", imports + MODULE + fit)
        assert loaded == ("tensorflow" in imports), imports
    assert len(list(tmp_path.glob("lightning_logs/version_*/events.out.tfevents.*"))) == 2


@pytest.mark.parametrize("trainer, message", [
    ("strategy='ddp_spawn', devices=2", "strategy='ddp_spawn' starts processes of its own; "
                                        "on hvd_magic's ranks write strategy='ddp', devices=2, "
                                        "num_nodes=1"),
    ("strategy='ddp', devices=1", "devices=1 and num_nodes=1 make 1 process, but this cell runs "
                                  "on 2 ranks; on hvd_magic's ranks write strategy='ddp', "
                                  "devices=2, num_nodes=1"),
])
def test_a_trainer_that_does_not_fit_the_ranks_says_what_to_write(ip, trainer, message):
    cell = f"import lightning as L\nL.Trainer(accelerator='cpu', num_nodes=1, {trainer})\n"
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet", cell)
    assert message in str(info.value)
    traceback = info.value.info["traceback"]
    assert "Cell In[" in traceback and "site-packages" not in traceback  # no Lightning screen


def test_lightning_in_a_warm_session_twice(ip, fresh_ns):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        ip.run_cell_magic("horovod", "--quiet", MODULE)
        first = ip.run_cell_magic("horovod", "--quiet", FIT.format(devices=2))
        second = ip.run_cell_magic("horovod", "--quiet", FIT.format(devices=2))
    finally:
        ip.run_line_magic("horovod_session", "stop")
    assert first == second  # the same start, data and steps: the same weights, both times
    assert_trained_as_one_process(first[2], lightning_batches)


def test_self_log_values_reach_mlflow(ip, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file: stores opt-in
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"file:{tmp_path}/mlruns")
    try:
        ip.run_cell_magic("horovod", "--np -2 --quiet --mlflow lightning",
                          MODULE + FIT.format(devices=2))
        client = mlflow.MlflowClient()
        [logged] = client.search_runs([client.get_experiment_by_name("lightning").experiment_id])
        history = client.get_metric_history(logged.info.run_id, "loss")
    finally:
        mlflow.set_tracking_uri(before)
    metrics = hvd_magic.last_run().metrics
    rank0 = metrics[(metrics["rank"] == 0) & (metrics.name == "loss")].sort_values("step")
    assert [m.step for m in history] == list(rank0.step) == [0, 1, 2, 3]
    assert [m.value for m in history] == pytest.approx(list(rank0.value))  # rank 0's, as charted


ACCELERATE = ROWS + """\
from accelerate import Accelerator
accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = rank_rows(accelerator.process_index)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for xb, yb in data:
    accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
    optimizer.step()
    optimizer.zero_grad()
weights = accelerator.gather(accelerator.unwrap_model(model).weight.detach())
(accelerator.num_processes, accelerator.process_index, weights.tolist())
"""


def test_an_accelerate_cells_timeline_steps_are_its_optimizer_steps(ip):
    """accelerate's prepared optimizer steps torch's inside its own: those are the profiled
    steps of every rank, with DDP's all_reduce in them."""
    pytest.importorskip("accelerate")
    from hvd_magic.timelines import ranks
    ip.run_cell_magic("horovod", "--np -2 --quiet --timeline-steps 2:3", ACCELERATE)
    run = hvd_magic.last_run()
    assert run.state == "done", run.error
    timeline = ranks.RanksTimeline.load(run.timeline_path)
    assert sorted((r["step"], r["rank"]) for r in timeline.table()) == [(2, 0), (2, 1), (3, 0),
                                                                        (3, 1)]
    assert "all_reduce" in timeline.verdict()


def test_accelerate_sees_the_ranks_and_trains_them_alike(ip):
    pytest.importorskip("accelerate")
    processes, index, weights = ip.run_cell_magic("horovod", "--np -2 --quiet", ACCELERATE)
    assert (processes, index) == (2, 0)  # rank 0's value: the world of 2, as under torchrun
    # its prepared loader gives process r batches r, r + 2, ... of its own (of 4 rows)
    assert_trained_as_one_process(weights, lambda rank: [
        (x[i:i + 4], y[i:i + 4]) for x, y in [rank_rows(rank)] for i in range(4 * rank, 32, 8)])
