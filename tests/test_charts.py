"""Live metric charts: every point a rank reports reaches the driver, the dashboard draws a chart
per metric with a line per rank, a saved notebook keeps a static picture, the text view prints a
summary, and `Run.metrics` is tidy data."""

import base64
import io
import os
import re

import nbformat
import pytest

import hvd_magic
from hvd_magic.view import TextView, charts
from test_notebooks import WIDGET_VIEW

REPORTING = """\
import time, os
import hvd_magic
rank = int(os.environ["HOROVOD_RANK"])
for step in range({steps}):
    hvd_magic.report(step=step, total={steps}, loss=step * (rank + 1), acc=1.0 - 1.0 / (step + 1))
    time.sleep({pause})
"""


def static_charts(markup):
    """The SVG charts of a finished run's static rendition (images of SVG data)."""
    return [base64.b64decode(data).decode()
            for data in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', markup)]


def test_every_reported_point_comes_back_as_tidy_metrics(ip):
    out = io.StringIO()
    ip.run_cell_magic("horovod", "--np -2 --quiet", REPORTING.format(steps=300, pause=0))
    run = hvd_magic.last_run()
    metrics = run.metrics
    assert list(metrics.columns) == ["rank", "step", "name", "value"]
    assert len(metrics) == 2 * 300 * 2  # not thinned by the ten-a-second event throttle
    loss = metrics[metrics.name == "loss"].sort_values(["rank", "step"])
    for rank in (0, 1):
        mine = loss[loss["rank"] == rank]
        assert list(mine.step) == list(range(300))
        assert list(mine.value) == [s * (rank + 1) for s in range(300)]
    TextView(stdout=out).finish(run)
    text = out.getvalue()
    assert "loss: last (min..max): rank 0 299 (0..299); rank 1 598 (0..598)" in text
    assert "acc: last (min..max): rank 0 0.997 (0..0.997)" in text


def test_a_chart_draws_a_line_per_rank_through_the_reported_points():
    class Rank:
        def __init__(self, rank, history):
            self.rank, self.history = rank, history

    ranks = [Rank(0, [[s, {"loss": 10 - s, "note": "text"}] for s in range(10)]),
             Rank(1, [[s, {"loss": 20 - 2 * s}] for s in range(5)])]  # fell behind
    svg = charts.charts_html(ranks)
    assert svg.count("<svg") == 1 and 'data-metric="loss"' in svg  # "note" is not a number
    lines = dict(re.findall(r'data-rank="(\d)" points="([^"]+)"', svg))
    points = {r: [tuple(map(float, p.split(","))) for p in lines[r].split()] for r in lines}
    assert len(points["0"]) == 10 and len(points["1"]) == 5
    xs0 = [x for x, _ in points["0"]]
    assert xs0 == sorted(xs0) and points["1"][-1][0] < xs0[-1]  # rank 1's line ends early
    top = min(y for line in points.values() for _, y in line)
    assert points["1"][0][1] == top  # 20, the largest value, drawn highest


def execute_cells(cells, cwd):
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    env = {k: v for k, v in os.environ.items() if k != "HVD_MAGIC_NO_WIDGETS"}
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute(env=env)
    path = os.path.join(cwd, "charts.ipynb")
    nbformat.write(nb, path)
    return nbformat.read(path, as_version=4)  # as saved


def test_the_saved_notebook_keeps_the_finished_dashboard_as_html(tmp_path):
    """Run through nbclient and saved: the dashboard's output is HTML that any viewer shows
    without the kernel (no widget left to read "model not found"): the table's rows and states,
    the log links, the charts as images in the dashboard's place; and the cell's value."""
    nb = execute_cells(["%load_ext hvd_magic",
                        "%%horovod --np -2\n" + REPORTING.format(steps=40, pause=0.08)
                        + "'the value ' + str(6 * 7)"], tmp_path)
    run_cell = nb.cells[1]
    assert not [o for o in run_cell.outputs if WIDGET_VIEW in o.get("data", {})]
    [final] = [o.data for o in run_cell.outputs if "hvd-magic-run" in o.get("data", {}).get(
        "text/html", "")]
    markup = final["text/html"]
    assert len(re.findall(r"<tr data-rank='\d' data-state='done' data-step='39' "
                          r"data-total='40'>", markup)) == 2
    assert markup.count(">done</span>") >= 3  # the header's and each row's
    assert "rank-0.log" in markup and "rank-1.log" in markup
    assert "<svg" not in markup  # (inline SVG is stripped from an untrusted notebook's HTML)
    assert "rank 0 on " in final["text/plain"] and ": done" in final["text/plain"]
    [value] = [o for o in run_cell.outputs if o.output_type == "execute_result"]
    assert value.data["text/plain"] == "'the value 42'"
    assert not [o for o in run_cell.outputs if "image/svg+xml" in o.get("data", {})]
    pictures = static_charts(markup)  # in the table's place below it, not after the links
    assert markup.index("data:image/svg+xml") < markup.index("rank-0.log")
    for metric in ("loss", "acc"):
        [chart] = [p for p in pictures if f'data-metric="{metric}"' in p]
        lines = dict(re.findall(r'data-rank="(\d)" points="([^"]+)"', chart))
        assert sorted(lines) == ["0", "1"]
        assert all(len(points.split()) == 40 for points in lines.values())
        assert "rank 0</text>" in chart and "rank 1</text>" in chart  # the legend


KERAS = """\
import numpy as np
import keras
import horovod.keras as hvd
import hvd_magic.keras
hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
model = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="binary_crossentropy",
              metrics=["accuracy"])
history = model.fit(x, y, epochs=4, batch_size=32, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd_magic.keras.MetricsCallback(every_n_batches=4)])
history.history["loss"]
"""


def test_the_keras_callback_reports_every_epoch_and_every_n_batches(ip):
    losses = ip.run_cell_magic("horovod", "--np -2 --quiet", KERAS)
    metrics = hvd_magic.last_run().metrics
    for rank in (0, 1):
        mine = metrics[metrics["rank"] == rank]
        epochs = mine[mine.name == "loss"].sort_values("step")
        assert list(epochs.step) == [1, 2, 3, 4]
        if rank == 0:
            assert list(epochs.value) == pytest.approx(losses)  # what Keras itself recorded
        assert set(mine.name) >= {"loss", "accuracy", "loss (batch)", "accuracy (batch)"}
        assert list(mine[mine.name == "loss (batch)"].step) == list(range(4, 33, 4))  # 8 a epoch


TENSORBOARD = """\
import os
from torch.utils.tensorboard import SummaryWriter
import hvd_magic
writer = SummaryWriter(hvd_magic.tensorboard_dir())
rank = int(os.environ["HOROVOD_RANK"])
for step in range(5):
    writer.add_scalar("loss", (rank + 1) * step, step)
writer.close()
"""


def test_tensorboard_logs_come_back_per_rank_and_the_magic_finds_them(ip, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ip.run_cell_magic("horovod", f"--np -2 --quiet --tensorboard {tmp_path / 'tb'}", TENSORBOARD)
    run = hvd_magic.last_run()
    assert run.tensorboard_dir == str(tmp_path / "tb")
    assert ip.run_line_magic("horovod_tensorboard", "--path") == run.tensorboard_dir
    assert ip.run_line_magic("horovod_tensorboard", f"{run.id[-4:]} --path") == run.tensorboard_dir
    for rank in (0, 1):
        events = EventAccumulator(str(tmp_path / "tb" / f"rank-{rank}"))
        events.Reload()
        assert [(s.step, s.value) for s in events.Scalars("loss")] == \
            [(step, float((rank + 1) * step)) for step in range(5)]


def test_a_loss_over_decades_gets_a_log_axis_with_ticks_and_a_legend_that_says_rank():
    class Rank:
        def __init__(self, rank, history):
            self.rank, self.history = rank, history

    # a loss from 6.8 to 0.03: on a linear axis, a flat line along the bottom after step 20
    ranks = [Rank(r, [[s, {"loss": 6.8 * 0.93 ** s + 0.03, "acc": s / 100}] for s in range(80)])
             for r in range(2)]
    loss, acc = (charts.chart_svg(name, lines)
                 for name, lines in sorted(charts.series(ranks).items(), reverse=True))
    assert 'data-scale="log"' in loss and "(log scale)" in loss
    assert 'data-scale="log"' not in acc
    assert int(re.search(r'width="(\d+)"', loss).group(1)) >= 400  # readable, not 250 x 100
    ticks = [float(t) for t in re.findall(r'data-tick="y">([^<]+)<', loss)]
    assert {0.1, 0.2, 0.5, 1.0, 2.0, 5.0} <= set(ticks)
    assert [float(t) for t in re.findall(r'data-tick="x">([^<]+)<', loss)] == [0, 20, 40, 60]
    # step 40's loss (0.40) is 0.58 of the way down the plot on the log axis (0.95 on a linear one)
    points = [tuple(map(float, p.split(","))) for p in
              re.search(r'data-rank="0" points="([^"]+)"', loss).group(1).split()]
    ys = [y for _, y in points]
    assert 0.5 < (ys[40] - min(ys)) / (max(ys) - min(ys)) < 0.7
    assert "rank 0</text>" in loss and "rank 1</text>" in loss and "■" not in loss
    # a value <= 0 keeps the linear axis
    assert "log" not in charts.chart_svg("m", {0: [(0, 0.0), (1, 1000.0)]})
