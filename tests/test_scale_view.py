"""Many ranks read at a glance: above 16 ranks the dashboard and the text view summarise.

A real `Run` (its run folder, its `RankState`s, the driver's own `apply_event`) is fed the events
64 ranks' tasks would send: states, lines, progress with metric points, a rank that fails, one
that waits in a collective, one that lags. The dashboard is the real ipywidgets one; its widget
objects are read back as a front end would draw them.
"""

import io
import re

from IPython.utils.capture import capture_output

from hvd_magic.driver.apply import apply_event
from hvd_magic.driver.run import Run
from hvd_magic.config import RunOptions
from hvd_magic.view.dashboard import Dashboard
from hvd_magic.view.text import TextView
from test_charts import static_charts

NP = 64
STEPS = 30


def fed_run(view, tmp_path):
    run = Run(NP, RunOptions(run_dir=str(tmp_path / "run")), view=view)
    run.folder.create(NP)
    run.state, run.where, run.started = "running", "simulated", 1.0
    view.start(run)

    def send(event):
        apply_event(run, event, lambda reason: None)

    for r in range(NP):
        send({"t": "state", "rank": r, "state": "running", "host": f"host-{r // 8}",
              "local_rank": r % 8, "pid": 1000 + r})
    for r in range(NP):
        steps = 10 if r == 5 else STEPS  # rank 5 lags
        for step in range(steps):
            send({"t": "lines", "rank": r, "stream": "stdout", "lines": [f"rank {r} step {step}"]})
            send({"t": "progress", "rank": r, "step": step + 1, "total": STEPS,
                  "metrics": {"loss": 1 / (step + 1)},
                  "points": [[step + 1, {"loss": 1 / (step + 1) + r / 1000, "note": "x"}]]})
    send({"t": "blocked", "rank": 9, "op": "allreduce", "seconds": 40})
    send({"t": "exit", "rank": 7, "code": 1, "status": "error",
          "summary": {"type": "ValueError", "message": "bad batch"}})
    return run


def test_the_dashboard_summarises_64_ranks_and_any_rank_is_one_number_away(ip, tmp_path,
                                                                          monkeypatch):
    # a terminal shell keeps only text/plain; a notebook front end keeps the SVG too
    monkeypatch.setattr(ip.display_formatter, "active_types", ["text/plain", "image/svg+xml"])
    view = Dashboard()
    run = fed_run(view, tmp_path)
    with capture_output():
        view._show(run)
    table = view.table.value
    assert "<b>64 ranks</b>: 1 " in table and "63 " in table  # counts by state
    assert "step min 10 · median 30 · max 30 of 30" in table
    assert table.count("data-rank=") < 10  # no row per rank: only the pinned ones
    pinned = dict((why, int(rank)) for why, rank in re.findall(
        r"data-pinned='(\w+)' data-rank='(\d+)'", table))
    assert pinned == {"failed": 7, "stalled": 9, "slowest": 5}
    assert re.findall(r"data-host='([^']+)'", table) == [f"host-{h}" for h in range(8)]
    assert view.panels == [] and view.picker is not None  # no accordion of 64 panels

    assert "data-rank='7'" in view.picker.panel.value  # the failed rank is shown first
    view.picker.selector.value = 13  # as a front end's edit of the box sets it
    panel = view.picker.render()
    assert "data-rank='13'" in panel and "rank 13 step 29" in panel

    charts = view._charts_html(run)
    assert 'data-band="64"' in charts and "<polyline data-rank" not in charts  # mean, band
    assert 'data-metric="note"' not in charts  # not a number
    view.picker.lines.value = True  # per-rank lines on request
    view._charts.key, view._charts.when = None, 0.0  # (drawn again now)
    assert len(re.findall(r'<polyline data-rank="\d+"', view._charts_html(run))) == NP

    run.state = "failed"
    with capture_output() as shown:
        view.finish(run)
    # The dashboard's display becomes its static rendition: the summary, the band charts as
    # images, the picked rank's row and log (what a saved notebook keeps)
    [final] = [o.data["text/html"] for o in shown.outputs if "text/html" in o.data]
    assert "<b>64 ranks</b>" in final and "data-rank='13'" in final
    [picture] = static_charts(final)
    assert 'data-band="64"' in picture and 'data-metric="loss"' in picture
    assert not [o for o in shown.outputs if "image/svg+xml" in o.data]  # not a second time
    footer = view.footer.value
    assert "rank-63.log" in footer and "rank 20:" not in footer  # not 64 links
    assert "rank-15.log'" in footer and "raw</a>) · … · rank 63:" in footer  # (and says that
    # some are left out)

    metrics = run.metrics  # every point, from the columns
    assert len(metrics) == 2 * (63 * STEPS + 10)
    mine = metrics[(metrics["rank"] == 3) & (metrics.name == "loss")]
    assert list(mine.step) == list(range(1, STEPS + 1))
    assert list(run.ranks[3].history)[0] == [1, {"loss": 1.003, "note": "x"}]
    # each metric: its steps, its values (8 B a number; a note's list, 8 B a value) and the
    # number of each value's point
    assert run.ranks[3].history.nbytes() == 2 * 3 * 8 * STEPS


def test_the_text_view_prints_rank_0_and_a_summary_of_64_ranks(tmp_path):
    out = io.StringIO()
    view = TextView(stdout=out, stderr=out)
    run = fed_run(view, tmp_path)
    run.state, run.ended = "failed", 2.0
    view.finish(run)
    text = out.getvalue()
    assert "[rank 0] rank 0 step 29" in text and "[rank 1]" not in text
    assert "64 ranks: 1 failed, 63 running" in text
    assert "failed: rank 7" in text and "stalled: rank 9" in text
    assert "slowest: rank 5 (step 10)" in text
    assert "  host-0: 8 ranks, 1 failed, 7 running" in text
    assert re.search(r"loss: last mean [\d.]+ \(min [\d.]+, max [\d.]+ across 64 ranks\)", text)
    assert "  rank 12 " not in text  # no line per rank


MB = 1 << 20
# rank: (its first sample's rss, its latest, its limit and whose) in MB: the five with the most
# memory now, and rank 77, whose peak is high but whose memory now is not among them
BIG = {123: (3000, 2560, 4000, "cgroup"), 250: (1300, 1200, None, "host"),
       17: (900, 900, 960, "cgroup"), 299: (800, 700, None, "host"),
       42: (650, 650, None, "host"), 77: (2000, 640, None, "host")}


def sampled_ranks(np=300):
    """`np` real RankStates on hosts of 30 ranks, each fed two samples as its task sends them
    (hvd_magic/task/resources.py); the newest sample of host h says 50 - h GB are free."""
    from hvd_magic.driver.ranks import RankState
    ranks = []
    for r in range(np):
        rank = RankState(r)
        rank.host, rank.state = f"host-{r // 30}", "running"
        first, now, limit, whose = BIG.get(r, (100 + r % 50, 100 + r % 50, None, "host"))
        for t, rss, free in ((1000.0, first, 99), (1001.0 + r / 1000, now, 50 - r // 30)):
            rank.usage.add({"t": "resources", "time": t, "cpu": 99.0, "rss": rss * MB,
                            "peak": max(first, rss) * MB, "limit": (limit or 65536) * MB,
                            "limit_of": whose, "free": free << 30, "gpus": []})
        ranks.append(rank)
    return ranks


def test_the_summary_of_300_ranks_names_the_most_memory_and_each_hosts_total():
    import types
    from hvd_magic.view.summary import band_charts, summary_html
    from hvd_magic.view.table import TABLE_HEAD, row_html, state_html
    from hvd_magic.words import size

    ranks = sampled_ranks()
    run = types.SimpleNamespace(ranks=ranks, np=len(ranks))
    table = summary_html(run, lambda r: row_html(r, ()), TABLE_HEAD, state_html)
    top = re.findall(r"<tr data-memory-rank='(\d+)'>(.*?)</tr>", table)
    assert [int(rank) for rank, _ in top] == [123, 250, 17, 299, 42]  # most memory now first
    cells = {int(rank): re.findall(r"<td[^>]*>([^<]*)</td>", row) for rank, row in top}
    assert cells[123] == ["123", "host-4", "2.5 GB", "2.93 GB", "64% of 3.91 GB"]
    assert cells[250] == ["250", "host-8", "1.17 GB", "1.27 GB", "2% of 64 GB"]
    assert cells[17] == ["17", "host-0", "900 MB", "900 MB", "94% of 960 MB"]
    assert "color:#c62828' title='its cgroup&#x27;s'>94% of 960 MB" in table  # near its limit
    # each host's total of its ranks' memory now, and its free memory in the newest sample
    hosts = dict(re.findall(r"<tr data-host='([^']+)'>.*?<td[^>]*>([^<]*)</td></tr>", table))
    assert len(hosts) == 10
    assert hosts["host-0"] == "4.12 GB · 50 GB free"  # 100..129 MB, and rank 17's 900 MB
    for h in range(10):
        total = sum(BIG.get(r, (0, 100 + r % 50))[1] for r in range(30 * h, 30 * h + 30))
        assert hosts[f"host-{h}"] == f"{size(total * MB)} · {50 - h} GB free"
    # the memory chart: the mean and min-max band of the 300 ranks, the lowest limit dashed
    memory = band_charts(ranks)[-1]
    assert 'data-memory="GB"' in memory and 'data-band="300"' in memory
    assert f'<g data-limit="{960 * MB}">' in memory and "limit 960 MB (rank 17)" in memory


def test_the_summary_has_no_memory_before_any_sample(tmp_path):
    view = TextView(stdout=io.StringIO())
    run = fed_run(view, tmp_path)
    from hvd_magic.view.summary import band_charts, summary_html
    from hvd_magic.view.table import TABLE_HEAD, row_html, state_html
    table = summary_html(run, lambda r: row_html(r, ()), TABLE_HEAD, state_html)
    assert "most memory" not in table and "data-memory-rank" not in table
    assert "free</td>" not in table
    assert not [c for c in band_charts(run.ranks) if "data-memory" in c]
