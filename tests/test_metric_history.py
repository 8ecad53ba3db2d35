"""A rank's metric history on the driver is bounded however long the run (`MetricHistory`: at
most `KEEP` values a metric, the older ones at a stride, the newest at full rate), while
`Run.metrics` still has every point, read back from the run folder's events.jsonl."""

import math
import shutil
import tracemalloc
from types import SimpleNamespace

from hvd_magic.config import RunOptions
from hvd_magic.driver.apply import apply_event
from hvd_magic.driver.metrics import KEEP, RECENT, MetricHistory
from hvd_magic.driver.ranks import RankState
from hvd_magic.driver.run import Run
from hvd_magic.view import pacing

N = 100_000


def loss(step):
    return 1.0 / step


def fed(points_per_event):
    history = MetricHistory()
    for start in range(1, N + 1, points_per_event):
        history.extend([[s, {"loss": loss(s), "val": -float(s)} if s % 5000 == 0 else
                         {"loss": loss(s)}] for s in range(start, start + points_per_event)])
    return history


def test_a_history_fed_100000_points_keeps_at_most_KEEP_spanning_the_run():
    for points_per_event in (1, 1000):  # a live rank's events; a tight loop's
        history = fed(points_per_event)
        steps, values = history.numeric()["loss"]
        assert len(steps) <= KEEP and history.reported == N
        assert steps[0] == 1 and steps[-1] == N  # the whole run...
        assert list(steps[-RECENT:]) == list(range(N - RECENT + 1, N + 1))  # its end in full
        older = {b - a for a, b in zip(steps, steps[1:]) if b <= N - RECENT}
        stride = max(older)  # ... its start at one stride (a power of 2), then its end
        assert stride & (stride - 1) == 0 and N / stride < KEEP
        assert steps[:10].tolist() == [1 + k * stride for k in range(10)]
        assert all(v == loss(s) for s, v in zip(steps, values))  # real values, not averages
        # a metric reported once in 5000 points keeps every value
        assert list(history.numeric()["val"][0]) == list(range(5000, N + 1, 5000))
        assert history.nbytes() <= 2 * KEEP * 24  # 24 bytes a value kept


def test_the_memory_of_a_rank_stays_bounded():
    tracemalloc.start()
    try:
        history, sizes, held = MetricHistory(), [], []
        for start in range(1, 10 * N, 10_000):  # a million points, in a rank's largest events
            before = tracemalloc.get_traced_memory()[0]
            history.extend([[s, {"loss": loss(s), "accuracy": 0.5}]
                            for s in range(start, start + 10_000)])
            sizes.append(history.nbytes())
            held.append(tracemalloc.get_traced_memory()[0] - before)  # what it grew by
    finally:
        tracemalloc.stop()
    assert history.reported == 10 * N and len(history) <= KEEP
    assert max(sizes) <= 2 * KEEP * 24  # 48 KB a rank, 48 MB at 1024 ranks
    assert sum(held) < 4 * 2 * KEEP * 24  # the arrays' own spare room and all


def test_points_read_back_as_reported_with_their_steps_and_values():
    history = MetricHistory([[1, {"loss": 0.5, "note": "x"}], [2.5, {"loss": 1}],
                             ["a", {"note": "y"}], "not a point", [4, {"flag": True}]])
    points = list(history)
    assert points[:2] == [[1, {"loss": 0.5, "note": "x"}], [2.5, {"loss": 1.0}]]
    assert math.isnan(points[2][0]) and points[2][1] == {"note": "y"}
    assert points[3] == [4, {"flag": True}] and len(history) == 4
    assert set(history.numeric()) == {"loss"}  # the notes and the flag are not numbers
    steps, notes = history.columns()["note"]
    assert steps[0] == 1 and math.isnan(steps[1]) and notes == ["x", "y"]


def fed_run(tmp_path, np=3, events=30, per_event=1000):
    run = Run(np, RunOptions(run_dir=str(tmp_path / "run")))
    run.folder.create(np)
    for e in range(events):
        for r in range(np):
            first = e * per_event + 1
            points = [[s, {"loss": loss(s) + r, "lr": 0.1}]
                      for s in range(first, first + per_event)]
            apply_event(run, {"t": "progress", "rank": r, "step": points[-1][0],
                              "total": events * per_event, "points": points}, lambda _: None)
    return run


def test_run_metrics_has_every_point_read_back_from_the_run_folder(tmp_path):
    run = fed_run(tmp_path)
    run.folder.close()  # (the driver's loop does, at the end of the run)
    assert all(len(r.history) <= KEEP for r in run.ranks)  # thinned in memory
    for _ in range(2):  # asked twice: the same table
        table = run.metrics
        assert len(table) == 3 * 2 * 30_000
        mine = table[(table["rank"] == 2) & (table.name == "loss")]
        assert list(mine.step) == list(range(1, 30_001))
        assert list(mine.value) == [loss(s) + 2 for s in range(1, 30_001)]
        assert run.folder._read_back is None  # nothing kept once handed out

    shutil.rmtree(run.run_dir)  # without its folder: the points kept here
    table = run.metrics
    assert 0 < len(table[(table["rank"] == 0) & (table.name == "loss")]) <= KEEP


def test_a_run_folder_used_again_reads_back_only_this_runs_points(tmp_path):
    fed_run(tmp_path).folder.close()
    run = fed_run(tmp_path, events=2)  # the same run_dir: its events.jsonl goes on
    run.folder.close()
    table = run.metrics
    mine = table[(table["rank"] == 1) & (table.name == "loss")]
    assert list(mine.step) == list(range(1, 2001))


def test_a_history_that_was_not_thinned_reads_its_own_columns(tmp_path):
    run = fed_run(tmp_path, np=2, events=2, per_event=10)
    shutil.rmtree(run.run_dir)  # (not needed: nothing was left out)
    assert len(run.metrics) == 2 * 2 * 20


def test_the_charts_are_drawn_again_when_points_come_whatever_a_thinned_history_keeps(
        monkeypatch):
    drawn = []
    monkeypatch.setattr(pacing, "charts_html", lambda ranks, since=None: drawn.append(1) or "charts")
    scratch, first_at = MetricHistory(), {}
    for step in range(1, 5 * KEEP):  # the steps at which the points kept come back to a number
        scratch.append(step, {"loss": loss(step)})
        if len(scratch) in first_at:
            earlier, later = first_at[len(scratch)], step
            break
        first_at[len(scratch)] = step
    rank = RankState(0)
    run = SimpleNamespace(ranks=[rank], np=1)
    redraw = pacing.ChartRedraw(interval=0)
    for step in range(1, later + 1):
        rank.history.append(step, {"loss": loss(step)})
        if step in (earlier, later):
            redraw.html(run, banded=False)
    assert len(drawn) == 2  # new points, the same number kept: drawn again
