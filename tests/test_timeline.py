"""Issue 6: rank 0's Horovod timeline comes back to the run folder, valid, summarised and drawn.

Real ranks and real Horovod throughout; driver-only (``np=-2``) where Spark is not the point.
Spans are paired from the raw JSON here, independently of `hvd_magic.timeline`, so the checks
do not trust the code they check.
"""

import importlib
import json
import os
import shutil
import sys
import time

import cloudpickle
import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic.view import TextView
from hvd_magic.timelines import picture as tl_picture, show as tl_show, summary as tl_summary, trace as tl_trace

from conftest import pictures_in

# The functions below run on the ranks, which cannot import this test module: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TWO_TENSORS_CELL = """\
import torch, horovod.torch as hvd
hvd.init()
for step in range({steps}):
    hvd.allreduce(torch.ones(8), name="grad.a")
    hvd.allreduce(torch.ones(4, 2, dtype=torch.float64), name="grad.b")
hvd.rank()
"""

FAILING_CELL = """\
import torch, horovod.torch as hvd
hvd.init()
for step in range(10 ** 9):
    hvd.allreduce(torch.ones(16), name="loop")
    if hvd.rank() == 1 and step == 10:
        raise RuntimeError("rank 1 gives up at step 10")
"""

FOREVER_CELL = """\
import torch, horovod.torch as hvd, hvd_magic
hvd.init()
for step in range(10 ** 9):
    hvd.allreduce(torch.ones(16), name="loop")
    hvd_magic.report(step=step + 1)
"""

# 50 steps; steps 20-24 inside `with hvd_magic.timeline():`, where a tensor of their own is
# allreduced too.
WINDOW_CELL = """\
import torch, horovod.torch as hvd, hvd_magic
hvd.init()

def step(i, extra=None):
    hvd.allreduce(torch.ones(8), name="grad")
    if extra:
        hvd.allreduce(torch.ones(8), name=extra)

for i in range(20):
    step(i)
with hvd_magic.timeline():
    for i in range(20, 25):
        step(i, extra="window")
for i in range(25, 50):
    step(i)
"""


# --- reading the JSON by hand ---------------------------------------------------------------

def load(path):
    with open(path) as f:
        return json.load(f)  # the check that it is valid JSON


def tensor_pids(events):
    return {e["args"]["name"]: e["pid"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e["args"]}


def complete_spans(events, phase):
    """(pid, duration) of every span named `phase` that has both its B and E event."""
    stacks, spans = {}, []
    for e in events:
        if e.get("ph") == "B":
            stacks.setdefault(e["pid"], []).append(e)
        elif e.get("ph") == "E" and stacks.get(e["pid"]):
            begin = stacks[e["pid"]].pop()
            if begin["name"] == phase:
                spans.append((e["pid"], e["ts"] - begin["ts"]))
    return spans


def allreduces_of(events, tensor):
    """How many allreduce operations of `tensor` the timeline holds from start to end."""
    pid = tensor_pids(events).get(tensor)
    return sum(1 for p, _ in complete_spans(events, "ALLREDUCE") if p == pid)


def wait_until(condition, what, timeout=180):
    """Poll a real signal (the ranks' progress events), not a guessed delay."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --- functions for the API (they run on the ranks) -------------------------------------------

def train_mlp(steps):
    import torch
    import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optimizer.step()
    hvd.allreduce(torch.ones(4, 2, dtype=torch.float64), name="grad.b")
    return hvd.rank()


def allreduce_forever():
    import torch
    import horovod.torch as hvd
    import hvd_magic
    hvd.init()
    step = 0
    while True:
        hvd.allreduce(torch.ones(16), name="loop")
        step += 1
        hvd_magic.report(step=step)


def two_windows():
    import torch
    import horovod.torch as hvd
    import hvd_magic
    hvd.init()
    for i in range(30):
        hvd.allreduce(torch.ones(8), name="grad")
        if i in (5, 6):
            with hvd_magic.timeline():
                hvd.allreduce(torch.ones(8), name="grad")
                hvd.allreduce(torch.ones(3), name=f"only.in.window.{i}")
    return hvd.rank()


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """A finished --timeline run of a small DistributedOptimizer training loop (10 steps)."""
    run = hvd_magic.run(train_mlp, np=-2, args=(10,), timeline=True,
                        run_dir=str(tmp_path_factory.mktemp("runs") / "mlp"))
    assert run.results == [0, 1]
    return run


# --- the whole run ---------------------------------------------------------------------------

def test_magic_timeline_run_on_spark_comes_back_drawn_and_findable(ip, capsys):
    ip.run_cell_magic("horovod", "--np 2 --timeline --text", TWO_TENSORS_CELL.format(steps=5))
    run = hvd_magic.last_run()
    assert run.state == "done" and run.where.startswith("local[")
    assert run.timeline_path == os.path.join(run.run_dir, "timeline.json")
    assert not os.path.exists(run.timeline_path + ".part")
    events = load(run.timeline_path)
    assert allreduces_of(events, "allreduce.grad.a") == 5
    assert allreduces_of(events, "allreduce.grad.b") == 5
    assert f"timeline: {os.path.relpath(run.timeline_path)}" in capsys.readouterr().out

    assert ip.run_line_magic("horovod_timeline", "--path") == run.timeline_path
    page = tl_show.timeline_html(run)
    assert f'href="hvd_runs/{run.id}/timeline.json"' in page  # relative to the notebook's folder
    # (Chromium removed chrome://tracing: how to open the file offline is said instead)
    assert "ui.perfetto.dev" in page and "chrome://tracing" not in page and "Offline" in page
    picture, = pictures_in(page)
    for text in ("allreduce.grad.a", "allreduce.grad.b", "NEGOTIATE_ALLREDUCE", "GLOO_ALLREDUCE"):
        assert text in picture
    shown = ip.run_line_magic("horovod_timeline", "")
    assert pictures_in(shown.data) and run.id in shown.data


def test_summary_agrees_with_the_json(ip, mlp_run):
    summary = ip.run_line_magic("horovod_timeline", f"{mlp_run.id} --summary")
    events = load(mlp_run.timeline_path)
    allreduce = next(r for r in summary.operations if r["operation"] == "ALLREDUCE")
    spans = complete_spans(events, "ALLREDUCE")
    assert allreduce["count"] == len(spans) == 4 * 10 + 1   # 4 parameters x 10 steps, + grad.b
    assert allreduce["total_us"] == sum(d for _, d in spans)
    grad_b = next(r for r in summary.tensors if r["tensor"] == "allreduce.grad.b")
    assert grad_b["count"] == 1 and grad_b["bytes"] == 4 * 2 * 8
    weight = next(r for r in summary.tensors if r["tensor"] == "allreduce.0.weight")
    assert weight["bytes"] == 32 * 16 * 4
    assert 0 < allreduce["share"] <= 1
    text, page = repr(summary), summary._repr_html_()
    assert "Top tensors" in text and "allreduce.0.weight" in text and "GLOO_ALLREDUCE" in text
    assert "<table>" in page and "allreduce.0.weight" in page


def test_choosing_runs_by_id_listing_and_folders_of_earlier_kernels(ip, mlp_run):
    assert ip.run_line_magic("horovod_timeline", f"{mlp_run.id} --path") == mlp_run.timeline_path
    # The end of its id: its time and random part (the random part alone, 4 hex digits, is also
    # another's among the suite's hundreds of runs now and then: "matches several runs").
    suffix = mlp_run.id.split("-", 1)[1]
    assert ip.run_line_magic("horovod_timeline", f"{suffix} --path") == mlp_run.timeline_path

    # A run folder left by an earlier kernel: not in this kernel's history, found on disk.
    old_id = "20000101-000000-0ld1"
    old_dir = os.path.join("hvd_runs", old_id)
    shutil.copytree(mlp_run.run_dir, old_dir)
    meta = load(os.path.join(old_dir, "run.json"))
    with open(os.path.join(old_dir, "run.json"), "w") as f:
        json.dump(dict(meta, id=old_id, started=946684800.0), f)  # 2000-01-01
    listing = ip.run_line_magic("horovod_timeline", "--list")
    ids = [row[0] for row in listing.rows]
    assert old_id in ids and mlp_run.id in ids
    assert ids.index(mlp_run.id) < ids.index(old_id)  # newest first
    assert ip.run_line_magic("horovod_timeline", f"{old_id} --path") == \
        os.path.abspath(os.path.join(old_dir, "timeline.json"))

    with pytest.raises(UsageError) as info:
        ip.run_line_magic("horovod_timeline", "no-such-run")
    assert type(info.value) is UsageError
    assert mlp_run.id in str(info.value) and old_id in str(info.value)


def test_a_run_without_timeline_says_how_to_record_one(ip, mlp_run):
    ip.run_cell_magic("horovod", "--np -2 --quiet", "1 + 1")
    run = hvd_magic.last_run()
    assert run.timeline_path is None
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("horovod_timeline", run.id)
    message = str(info.value)
    assert type(info.value) is UsageError
    assert "--timeline" in message and "hvd_magic.timeline()" in message
    assert mlp_run.id in message  # the runs that do have one
    # With no id: the latest run that has a timeline, not merely the latest run.
    latest = ip.run_line_magic("horovod_timeline", "--path")
    assert latest and not latest.startswith(run.run_dir)


# --- runs that end badly -------------------------------------------------------------------

def test_cancelled_run_leaves_a_valid_partial_timeline():
    run = hvd_magic.run(allreduce_forever, np=-2, timeline=True, background=True)
    wait_until(lambda: (run.ranks[0].step or 0) >= 20 or run.state != "running",
               "rank 0 to pass step 20")
    run.cancel()  # from this thread, while the driver loop runs in its own
    with pytest.raises(hvd_magic.RunCancelled):
        run.wait(timeout=120)
    assert run.state == "cancelled"
    events = load(run.timeline_path)
    # Rank 0 had finished 20 allreduces; at most the last, still in Horovod's buffers, is lost.
    assert allreduces_of(events, "allreduce.loop") >= 19


def test_timeout_leaves_a_valid_partial_timeline(ip):
    with pytest.raises(hvd_magic.RunTimeout):
        ip.run_cell_magic("horovod", "--np -2 --timeline --timeout 25 --quiet", FOREVER_CELL)
    run = hvd_magic.last_run()
    assert run.state == "timeout"
    reached = run.ranks[0].step
    assert reached, "rank 0 never got going: the machine is too busy for this test"
    events = load(run.timeline_path)
    assert allreduces_of(events, "allreduce.loop") >= reached - 2  # progress events lag a little


def test_rank_1_failing_leaves_a_valid_partial_timeline(ip):
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --timeline --quiet", FAILING_CELL)
    assert info.value.rank == 1
    run = hvd_magic.last_run()
    assert run.state == "failed"
    events = load(run.timeline_path)
    # Steps 0-10 completed on both ranks before rank 1 raised.
    assert allreduces_of(events, "allreduce.loop") >= 10
    summary = tl_summary.summarize(run.timeline_path)
    assert summary.operations and summary.tensors[0]["tensor"] == "allreduce.loop"


# --- a window recorded from inside the cell --------------------------------------------------

def test_window_records_only_its_steps(ip):
    ip.run_cell_magic("horovod", "--np -2 --quiet", WINDOW_CELL)
    window = hvd_magic.last_run()
    ip.run_cell_magic("horovod", "--np -2 --quiet --timeline", WINDOW_CELL)
    full = hvd_magic.last_run()
    assert window.timeline_path and full.timeline_path

    window_events, full_events = load(window.timeline_path), load(full.timeline_path)
    assert len(window_events) < len(full_events)
    assert allreduces_of(full_events, "allreduce.grad") == 50  # the window is a no-op here
    # start/stop_timeline block until rank 0's writer has opened / closed the file, and every
    # allreduce in between is synchronous: exactly the window's five steps are in it.
    assert allreduces_of(window_events, "allreduce.grad") == 5
    assert allreduces_of(window_events, "allreduce.window") == 5
    assert ip.run_line_magic("horovod_timeline", f"{window.id} --path") == window.timeline_path


def test_two_windows_are_kept_one_after_the_other():
    run = hvd_magic.run(two_windows, np=-2)
    events = load(run.timeline_path)
    pids = tensor_pids(events)
    assert len(set(pids.values())) == len(pids)  # one number per tensor across both windows
    assert allreduces_of(events, "allreduce.grad") == 2
    assert allreduces_of(events, "allreduce.only.in.window.5") == 1
    assert allreduces_of(events, "allreduce.only.in.window.6") == 1
    # The second window follows the first on the same clock.
    first = [e["ts"] for e in events if "ts" in e and e.get("pid") == pids["allreduce.only.in.window.5"]]
    second = [e["ts"] for e in events if "ts" in e and e.get("pid") == pids["allreduce.only.in.window.6"]]
    assert max(first) < min(second)


def test_timeline_outside_a_rank_says_where_it_works(monkeypatch):
    monkeypatch.delenv("HVD_MAGIC_TIMELINE_PATH", raising=False)
    with pytest.raises(RuntimeError, match="%%horovod"):
        with hvd_magic.timeline():
            pass
    importlib.import_module("hvd_magic.timelines.record")  # a submodule never shadows the function
    with pytest.raises(RuntimeError, match="%%horovod"):
        with hvd_magic.timeline():
            pass


# --- repair and drawing, on their own --------------------------------------------------------

def test_repair_keeps_every_whole_event_of_a_cut_off_file(mlp_run):
    events = load(mlp_run.timeline_path)
    # Horovod's own layout: "[", then the events one after another, the list closed after each.
    text, ends = "[\n", []
    for i, e in enumerate(events):
        text += ("," if i else "") + json.dumps(e)
        ends.append(len(text))
    for cut in (len(text) // 3, len(text) // 2, len(text) - 5):
        whole = sum(1 for end in ends if end <= cut)
        assert tl_trace.repair(text[:cut]) == events[:whole]
    assert tl_trace.repair(text + "]") == events


def test_finalize_turns_a_cut_off_part_file_into_json(tmp_path, mlp_run):
    events = load(mlp_run.timeline_path)
    text = "[\n" + ",".join(json.dumps(e) for e in events)
    (tmp_path / "timeline.json.part").write_text(text[:len(text) - 7])
    path = tl_trace.finalize(str(tmp_path))
    assert load(path) == events[:-1]
    assert not (tmp_path / "timeline.json.part").exists()


def test_picture_caps_lanes_for_many_tensors():
    events = []
    for pid in range(1, 101):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"t{pid}"}})
        for k in range(30):
            start = 1000 * k + pid
            events += [{"ph": "B", "name": "ALLREDUCE", "ts": start, "pid": pid},
                       {"ph": "B", "name": "QUEUE", "ts": start + 1, "pid": pid},
                       {"ph": "E", "ts": start + 5, "pid": pid},
                       {"ph": "E", "ts": start + 20 + pid, "pid": pid}]
    trace = tl_trace.Trace(events)
    picture = tl_picture.svg(trace, max_lanes=16)
    assert "+ 85 other tensors" in picture
    assert picture.count("<title>") == 16  # one per lane label
    assert "t100" in picture and "QUEUE" in picture  # the busiest tensor has its own lane
    assert len(picture) < 200_000


def test_magic_help_is_generated_with_examples():
    from hvd_magic.frontends.magics import HorovodMagics
    doc = HorovodMagics.horovod_timeline.__doc__
    for text in ("Examples", "--summary", "--list", "--path", "hvd_magic.timeline()"):
        assert text in doc


def slow_rank_1(steps):
    import time
    import torch
    import horovod.torch as hvd
    hvd.init()
    for _ in range(steps):
        if hvd.rank() == 1:
            time.sleep(0.02)  # its batch comes late: rank 0 waits for it in each allreduce
        hvd.allreduce(torch.ones(8), name="a")
        hvd.allreduce(torch.ones(8), name="b")
    return hvd.rank()


def test_the_timeline_names_the_rank_the_others_waited_on_and_its_shares_add_up(tmp_path):
    """DDP's and Lightning's timelines named the slow rank, Horovod's did not; and its "share of
    wall" columns added up to well over 100% (fused tensors overlap)."""
    run = hvd_magic.run(slow_rank_1, np=-2, args=(20,), timeline=True,
                        view=TextView(quiet=True), run_dir=str(tmp_path / "slow"))
    summary = tl_summary.summarize(run.timeline_path)
    verdict = summary.verdict()
    assert verdict.startswith("rank 1 was ready last at "), verdict
    count, waited = summary.waited_on()[1]
    assert count >= 30 and waited >= 20 * 0.015 * 1e6, summary.waited_on()  # µs
    for rows in (summary.tensors, summary.operations):
        assert sum(r["share"] for r in rows) <= 1.0 + 1e-9, rows
        assert sum(r["share"] for r in rows) == pytest.approx(summary.busy)
    assert "Rank 1 was ready last" in repr(summary)
    page = tl_show.timeline_html(run)
    assert "rank 1 was ready last" in page
    assert "timeline verdict: rank 1 was ready last" in tl_show.timeline_note(run)


def test_exclusive_shares_split_each_moment_among_what_was_active():
    shares = tl_trace.exclusive_shares([("a", 0, 10), ("b", 5, 15), ("a", 8, 12), ("c", 20, 30)])
    # 0-5 a alone, 5-12 a and b, 12-15 b alone, 20-30 c: 25 µs in all, never more
    assert shares == pytest.approx({"a": 5 + 3.5, "b": 3.5 + 3, "c": 10})
