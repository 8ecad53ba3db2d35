"""Live metric charts: every point a rank reports reaches the driver, the dashboard draws a chart
per metric with a line per rank, a saved notebook keeps a static picture, the text view prints a
summary, and `Run.metrics` is tidy data."""

import base64
import io
import os
import re
import time

import nbformat
import pytest

import hvd_magic
from hvd_magic.view import TextView, charts
from conftest import ipc_config
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
    NotebookClient(nb, timeout=600, kernel_name="python3", config=ipc_config(),
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


MB = 1 << 20


def resources(time, rss, limit=64 << 30, limit_of="host", peak=None):
    """A `resources` event as a rank's task sends it (hvd_magic/task/resources.py)."""
    return {"t": "resources", "time": time, "cpu": 95.0, "rss": rss, "peak": peak or rss,
            "limit": limit, "limit_of": limit_of, "free": 30 << 30, "gpus": []}


def sampled_ranks():
    """Two ranks sampled for 30 s: rank 0 grows from 100 to 390 MB under its cgroup's 400 MB
    limit, rank 1 stays at 200 MB with the host's memory as its limit."""
    from hvd_magic.driver.ranks import RankState
    ranks = [RankState(0), RankState(1)]
    for s in range(30):
        ranks[0].usage.add(resources(1000.0 + s, (100 + 10 * s) * MB, 400 * MB, "cgroup"))
        ranks[1].usage.add(resources(1000.5 + s, 200 * MB))
    return ranks


def memory_chart(svgs):
    [chart] = [c for c in svgs if "data-memory=" in c]
    return chart


def test_the_memory_chart_draws_each_ranks_samples_and_its_cgroups_limit_dashed():
    ranks = sampled_ranks()
    chart = memory_chart(charts.chart_svgs(ranks))
    assert 'data-memory="MB"' in chart and "memory (MB)" in chart and ">30 s</text>" in chart
    lines = dict(re.findall(r'data-rank="(\d)" points="([^"]+)"', chart))
    points = {r: [tuple(map(float, p.split(","))) for p in lines[r].split()] for r in lines}
    assert len(points["0"]) == len(points["1"]) == 30
    grid = {float(v): float(y) - 3.5 for y, v in re.findall(
        r'y="([\d.]+)" text-anchor="end" data-tick="y">([^<]+)<', chart)}
    assert points["0"][0][1] == pytest.approx((grid[0] + grid[200]) / 2, abs=0.1)  # 100 MB
    assert points["0"][-1][1] == pytest.approx(grid[0] - 390 / 400 * (grid[0] - grid[400]),
                                               abs=0.1)  # 390 MB
    assert all(y == pytest.approx(grid[200], abs=0.1) for _, y in points["1"])  # flat, 200 MB
    # rank 0's limit (its cgroup's, below the host's): a dashed line at 400 MB, labelled;
    # rank 1's (the host's memory) is not drawn
    [(limit, y)] = re.findall(r'<g data-limit="(\d+)">.*?<line [^>]*y1="([\d.]+)"', chart)
    assert int(limit) == 400 * MB and abs(float(y) - grid[400]) < 0.1
    assert "stroke-dasharray" in chart.split('data-limit="')[1]
    assert "limit 400 MB (rank 0)</text>" in chart
    assert "rank 0</text>" in chart and "rank 1</text>" in chart  # the legend


def test_charts_read_well_from_one_sample_on_and_time_counts_from_the_cells_start():
    """Axes a person reads: 918 MB tops a memory axis labelled "1,000", not "1e+03"; a chart
    of one step or one sample draws each rank's point as a dot, every rank in the legend; the
    memory chart's time starts where the cell did (the header's clock), not at its first
    sample."""
    from hvd_magic.driver.ranks import RankState
    ranks = [RankState(0), RankState(1)]
    for r in ranks:
        r.history.append(39, {"accuracy": 0.89})
        r.usage.add(resources(1004.0, (918 if r.rank else 300) * MB))
    metric, memory = charts.chart_svgs(ranks, since=1000.0)
    for chart in (metric, memory):
        assert re.findall(r'<circle data-rank="(\d)"', chart) == ["0", "1"], chart
        assert "rank 0</text>" in chart and "rank 1</text>" in chart
    labels = re.findall(r'data-tick="y">([^<]+)<', memory)
    assert "1,000" in labels and not [t for t in labels if "e+" in t], labels
    assert re.findall(r'data-tick="x">([^<]+)<', metric) == ["39"]
    # samples from 4 s to 8 s after the cell began: the axis says 8 s, the line starts at 4
    for r in ranks:
        r.usage.add(resources(1008.0, 400 * MB))
    memory = memory_chart(charts.chart_svgs(ranks, since=1000.0))
    assert ">8 s</text>" in memory
    first_x = float(re.search(r'data-rank="0" points="([\d.]+),', memory).group(1))
    assert first_x == pytest.approx(charts.LEFT + 0.5 * (charts.WIDTH - charts.LEFT
                                                         - charts.RIGHT), abs=0.5)


def test_the_memory_chart_is_there_only_once_memory_was_sampled():
    from hvd_magic.driver.ranks import RankState
    ranks = [RankState(0), RankState(1)]
    assert charts.chart_svgs(ranks) == [] and charts.charts_html(ranks) == ""
    for r in ranks:
        r.history.append(1, {"loss": 0.5})
    assert ['data-metric="loss"' in c for c in charts.chart_svgs(ranks)] == [True]
    ranks[1].usage.add(resources(1000.0, 300 * MB))
    metric, memory = charts.chart_svgs(ranks)  # beside the metric charts, last
    assert 'data-metric="loss"' in metric and 'data-memory="MB"' in memory
    assert re.findall(r'<polyline data-rank="(\d)"', memory) == ["1"]
    ranks[0].usage.add(resources(1000.0, 300 * MB))  # the same: both colours show, interleaved
    lines = dict(re.findall(r'<polyline data-rank="(\d)" points="[^"]+"([^>]*)>',
                            memory_chart(charts.chart_svgs(ranks))))
    assert "dasharray" not in lines["0"] and "stroke-dasharray" in lines["1"]
    # A limit far above the samples (an 8 GB cgroup, 300 MB used) is named, not drawn.
    ranks[1].usage.add(resources(1001.0, 300 * MB, 8 << 30, "cgroup"))
    memory = memory_chart(charts.chart_svgs(ranks))
    assert "<g data-limit" not in memory and "limit 8 GB: above</text>" in memory


def test_the_dashboard_draws_the_memory_chart_live_and_keeps_it_in_its_rendition(
        ip, tmp_path, monkeypatch):
    """The real Dashboard of a real Run fed two ranks' events: the memory chart with the live
    charts once samples came, redrawn with each new sample; an image of it in the finished
    run's rendition (what a saved notebook keeps)."""
    from IPython.utils.capture import capture_output
    from hvd_magic.config import RunOptions
    from hvd_magic.driver.apply import apply_event
    from hvd_magic.driver.run import Run
    from hvd_magic.view.dashboard import Dashboard

    monkeypatch.setattr(ip.display_formatter, "active_types", ["text/plain", "image/svg+xml"])
    view = Dashboard()
    run = Run(2, RunOptions(run_dir=str(tmp_path / "run")), view=view)
    run.folder.create(2)
    run.state, run.where, run.started = "running", "simulated", 1.0
    view.start(run)
    for r in range(2):
        apply_event(run, {"t": "state", "rank": r, "state": "running", "host": "vm"}, print)
    with capture_output():
        view._show(run)
    assert "data-memory" not in view.charts.value  # no sample yet
    for s in range(5):
        for r in range(2):
            apply_event(run, dict(resources(1000.0 + s, (100 + 50 * r + s) * MB), rank=r), print)

    def after_the_throttle():  # (a redrawing waits 10 times the last one's cost)
        time.sleep(10 * view._charts.cost + 0.05)
        return view._charts_html(run)

    drawn = after_the_throttle()
    assert re.search(r'data-rank="1" points="([^"]+)"', drawn).group(1).count(",") == 5
    apply_event(run, dict(resources(1005.0, 160 * MB), rank=1), print)
    redrawn = after_the_throttle()  # a new sample: drawn again (nothing else changed)
    assert re.search(r'data-rank="1" points="([^"]+)"', redrawn).group(1).count(",") == 6
    run.state = "done"
    with capture_output() as shown:
        view.finish(run)
    [final] = [o.data["text/html"] for o in shown.outputs if "text/html" in o.data]
    chart = memory_chart(static_charts(final))
    assert re.findall(r'<polyline data-rank="(\d)"', chart) == ["0", "1"]
    assert 'alt="memory (MB)"' in final
