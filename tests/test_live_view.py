"""The live per-rank dashboard, in a real kernel: cells run through jupyter_client as a notebook
front end would send them, and the widgets are read back from the kernel's own comm messages (what
a front end would draw) and from the widget objects in the kernel."""

import ast
import datetime
import os
import re
import subprocess
import sys
import textwrap

import pytest

import hvd_magic
from conftest import pictures_in, start_kernel
from test_charts import static_charts
from test_text_view import TERMINAL_CELL

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ROW = re.compile(r"<tr data-rank='(\d+)' data-state='([^']*)' data-step='([^']*)' "
                 r"data-total='([^']*)'>")


class Kernel:
    """A real IPython kernel (the venv's python3 kernelspec) with hvd_magic loaded."""

    def __init__(self, cwd, env=None):
        env = {k: v for k, v in dict(os.environ, **(env or {})).items()
               if k != "HVD_MAGIC_NO_WIDGETS"}
        self.cwd = cwd
        self.km, self.kc = start_kernel(cwd, env)
        reply, self.load_messages = self.execute("%load_ext hvd_magic\nimport hvd_magic")
        assert reply["content"]["status"] == "ok"

    def execute(self, code, on_message=None, timeout=300):
        """Run a cell; return its execute_reply and every IOPub message seen until it went idle.

        `on_message(msg)` sees each IOPub message as it arrives (to click a button mid-cell).
        """
        msg_id = self.kc.execute(code)
        messages = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            messages.append(msg)
            if on_message is not None:
                on_message(msg)
            if (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
                    and msg["parent_header"].get("msg_id") == msg_id):
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply, messages

    def value(self, expression):
        """The repr of an expression evaluated in the kernel, parsed back into Python."""
        reply, messages = self.execute(expression)
        assert reply["content"]["status"] == "ok", reply["content"]
        results = [m for m in messages if m["msg_type"] == "execute_result"]
        return ast.literal_eval(results[-1]["content"]["data"]["text/plain"])

    def click(self, comm_id):
        """What a front end sends when a Button is clicked."""
        msg = self.kc.session.msg("comm_msg", {
            "comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}})
        self.kc.shell_channel.send(msg)

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel()  # graceful: the kernel stops its Spark session too


class Widgets:
    """The widget models as a front end sees them, rebuilt from the kernel's comm messages."""

    def __init__(self, messages=()):
        self.models = {}
        self.updates = []  # (time sent, comm id, state) of every 'update' from the kernel
        for msg in messages:
            self.feed(msg)

    def feed(self, msg):
        content = msg["content"]
        if msg["msg_type"] == "comm_open" and content.get("target_name") == "jupyter.widget":
            self.models[content["comm_id"]] = dict(content["data"]["state"])
        elif msg["msg_type"] == "comm_msg" and content["data"].get("method") == "update":
            self.models.setdefault(content["comm_id"], {}).update(content["data"]["state"])
            self.updates.append((_sent(msg), content["comm_id"], content["data"]["state"]))

    def of(self, model_name):
        return {cid: s for cid, s in self.models.items() if s.get("_model_name") == model_name}

    def table_rows(self):
        tables = [s["value"] for s in self.of("HTMLModel").values() if "<tr data-rank=" in s["value"]]
        assert len(tables) == 1
        return rows(tables[0])

    def html_containing(self, text):
        return [s["value"] for s in self.of("HTMLModel").values() if text in s["value"]]


class CancelOnShow:
    """An `on_message` that clicks the dashboard's Cancel button as soon as the dashboard is shown
    (the cell still runs); `widgets` is what the front end saw, `shown` its HTML at the click."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.widgets = Widgets()
        self.clicked = None
        self.shown = ""

    def __call__(self, msg):
        self.widgets.feed(msg)
        if self.clicked or not shown_widgets([msg]):
            return
        buttons = [c for c, s in self.widgets.of("ButtonModel").items() if s["description"] == "Cancel"]
        assert len(buttons) == 1
        self.shown = "\n".join(s.get("value", "") for s in self.widgets.of("HTMLModel").values())
        self.kernel.click(buttons[0])
        self.clicked = buttons[0]


def rows(table_html):
    """{rank: (state, step, total)} from the dashboard's rank table."""
    return {int(r): (state, step, total) for r, state, step, total in ROW.findall(table_html)}


def _sent(msg):
    date = msg["header"]["date"]
    return date if isinstance(date, datetime.datetime) else datetime.datetime.fromisoformat(date)


def shown_widgets(messages):
    """The dashboard's display (it takes the place of the cell's first line, an update)."""
    return [m for m in messages if m["msg_type"] in ("display_data", "update_display_data")
            and WIDGET_VIEW in m["content"]["data"]]


def text_output(messages):
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def max_per_second(times):
    """The most messages sent within any one second."""
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while (t - times[start]).total_seconds() >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    yield k
    k.close()


TQDM_CELL = """\
%%horovod --np -4
import time
from tqdm import tqdm
for step in tqdm(range(50), desc="train"):
    time.sleep(0.04)
print("finished")
"""


def test_tqdm_cell_ends_with_every_rank_done_at_50_of_50(kernel):
    reply, messages = kernel.execute(TQDM_CELL)
    assert reply["content"]["status"] == "ok"
    assert len(shown_widgets(messages)) == 1
    widgets = Widgets(messages)
    # What a front end shows, from the kernel's comm messages...
    assert widgets.table_rows() == {k: ("done", "50", "50") for k in range(4)}
    # ...while the run went on, some rows showed progress between the start and the end.
    seen = [rows(state["value"]) for _, _, state in widgets.updates if "<tr data-rank=" in state.get("value", "")]
    partial = {step for table in seen for (_, step, total) in table.values()
               if step and total and 0 < int(step) < int(total)}
    assert partial, "no intermediate progress reached the dashboard"
    # ...and the widget objects in the kernel agree.
    assert kernel.value("type(hvd_magic.last_run().view).__name__") == "Dashboard"
    table = kernel.value("hvd_magic.last_run().view.table.value")
    assert rows(table) == {k: ("done", "50", "50") for k in range(4)}
    assert "desc=train" in table
    header = kernel.value("hvd_magic.last_run().view.header.value")
    assert "done" in header and "4 ranks" in header and "driver only" in header
    footer = kernel.value("hvd_magic.last_run().view.footer.value")
    run_id = kernel.value("hvd_magic.last_run().id")
    for rank in range(4):
        assert f"href='hvd_runs/{run_id}/rank-{rank}.log'" in footer
    assert kernel.value("hvd_magic.last_run().view.cancel_button.disabled") is True


def test_fast_cell_shows_its_lines_as_text_and_no_widget(kernel):
    """A run that ends before its dashboard would show: no widget, its lines as text, and its
    header line stays (the run id, its state, its time, more ranks than cores said, the logs'
    links), in the saved notebook too; so does a fast failure's, above its traceback."""
    kernel.execute("import hvd_magic.view.dashboard as _d; _shown_after, _d.SHOW_AFTER = "
                   "_d.SHOW_AFTER, 600")  # (fast, however loaded the machine)
    np = (os.cpu_count() or 1) + 1
    try:
        cell = (f"%%horovod --np -{np}\nimport os\n"
                "print('hello from', os.environ['HOROVOD_RANK'])\n6 * 7")
        reply, messages = kernel.execute(cell)
        failed_reply, failed = kernel.execute("%%horovod --np -2\nscael")
    finally:
        kernel.execute("_d.SHOW_AFTER = _shown_after")
    assert reply["content"]["status"] == "ok"
    assert not shown_widgets(messages)
    assert not [m for m in messages if m["msg_type"] == "comm_open"]
    out = text_output(messages)
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out
    results = [m for m in messages if m["msg_type"] == "execute_result"]
    assert results[-1]["content"]["data"]["text/plain"] == "42"
    run_id = kernel.value("hvd_magic.runs()[-2].id")
    header = last_html(messages)
    assert f"<code>{run_id}</code>" in header and "done" in header, header
    assert f"share this machine&#x27;s {os.cpu_count()} CPU core" in header, header
    assert f"href='hvd_runs/{run_id}/rank-0.log'" in header, header
    assert failed_reply["content"]["status"] == "error"
    header = last_html(failed)
    assert "failed" in header and "rank-0.log'" in header, header


def last_html(messages):
    """The HTML the cell's first output (its display, updated) was left with."""
    return [m["content"]["data"]["text/html"] for m in messages
            if m["msg_type"] in ("display_data", "update_display_data")
            and "text/html" in m["content"]["data"]][-1]


def test_quiet_shows_only_the_result(kernel):
    cell = "%%horovod --np -2 --quiet\nimport time\nprint('noise')\ntime.sleep(2)\n'value'"
    reply, messages = kernel.execute(cell)
    assert reply["content"]["status"] == "ok"
    assert not shown_widgets(messages)
    assert "noise" not in text_output(messages)
    results = [m for m in messages if m["msg_type"] == "execute_result"]
    assert results[-1]["content"]["data"]["text/plain"] == "'value'"


def test_text_option_forces_text_in_a_kernel(kernel):
    cell = "%%horovod --np -2 --text\nimport time\ntime.sleep(2)\nprint('plain')"
    reply, messages = kernel.execute(cell)
    assert reply["content"]["status"] == "ok"
    assert not shown_widgets(messages)
    assert "[rank 1] plain" in text_output(messages)
    assert "rank 1" in text_output(messages) and "done" in text_output(messages)


CANCEL_CELL = """\
%%horovod --np -2 --timeout 120
import time, hvd_magic
step = 0
while True:
    step += 1
    hvd_magic.report(step=step)
    time.sleep(0.05)
"""


def test_cancel_button_stops_a_cell_that_is_running(kernel):
    """The click arrives while the kernel's main thread is inside the cell (it never ends alone)."""
    cancel = CancelOnShow(kernel)
    reply, messages = kernel.execute(CANCEL_CELL, on_message=cancel)
    widgets = cancel.widgets
    assert cancel.clicked
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "RunCancelled"
    assert {state for state, _, _ in widgets.table_rows().values()} == {"cancelled"}
    assert any("cancelled" in h for h in widgets.html_containing("hvd_magic</b> run"))
    assert kernel.value("hvd_magic.last_run().state") == "cancelled"


def test_cancel_button_of_a_background_run(kernel):
    cell = CANCEL_CELL.replace("--timeout 120", "--timeout 120 --background")
    reply, messages = kernel.execute(cell)
    assert reply["content"]["status"] == "ok"
    assert len(shown_widgets(messages)) == 1  # shown while its cell still ran
    widgets = Widgets(messages)
    [button] = [cid for cid, s in widgets.of("ButtonModel").items() if s["description"] == "Cancel"]
    kernel.click(button)
    reply, _ = kernel.execute("try:\n    hvd_magic.last_run().wait(60)\nexcept hvd_magic.RunCancelled:\n"
                              "    print('cancelled')")
    assert reply["content"]["status"] == "ok"
    assert kernel.value("hvd_magic.last_run().state") == "cancelled"
    table = kernel.value("hvd_magic.last_run().view.table.value")
    assert {state for state, _, _ in rows(table).values()} == {"cancelled"}


UNREADABLE_CELL = """\
%%horovod --np -2
import os, time

def rebuild():
    if "HOROVOD_RANK" not in os.environ:
        raise ValueError("only a rank can rebuild this")

class OnlyOnRanks:
    def __reduce__(self):
        return rebuild, ()

time.sleep(3)  # (its dashboard shows)
OnlyOnRanks() if os.environ["HOROVOD_RANK"] == "1" else 0
"""


def test_a_value_the_notebook_cannot_read_finishes_the_dashboard(kernel):
    """Rank 1's value fails to unpickle in the kernel alone: the cell ends with an error naming
    rank 1, the dashboard is finished and lets go of the kernel's subshell (without the fix:
    the run stayed "running", the dashboard live, the subshell's lock held)."""
    reply, messages = kernel.execute(UNREADABLE_CELL)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "ResultError"
    said = "\n".join(reply["content"]["traceback"])
    assert "rank 1 on " in said and "ValueError: only a rank can rebuild this" in said, said
    assert len(shown_widgets(messages)) == 1
    assert kernel.value("hvd_magic.last_run().state") == "failed"
    assert kernel.value("hvd_magic.last_run().view.cancel_button.disabled") is True
    assert kernel.value("len(hvd_magic.last_run().view._let_go)") == 0  # nothing held
    assert "failed" in kernel.value("hvd_magic.last_run().view.header.value")
    assert Widgets(messages).table_rows() == {0: ("done", "", ""), 1: ("done", "", "")}
    reply, _ = kernel.execute("%%horovod --np -2 --quiet\n6 * 7")  # the kernel goes on
    assert reply["content"]["status"] == "ok"


LINES = 100_000
# Pauses stretch the flood over a few seconds, so that the dashboard is live for a while.
FLOOD_CELL = f"""\
%%horovod --np -4
import os, time
rank = os.environ["HOROVOD_RANK"]
for i in range({LINES}):
    print(f"rank {{rank}} line {{i}}")
    if i % 2500 == 0:
        time.sleep(0.05)
"""


def test_100k_lines_per_rank_all_logged_with_few_widget_updates(kernel):
    reply, messages = kernel.execute(FLOOD_CELL)
    assert reply["content"]["status"] == "ok"
    run_dir = kernel.value("hvd_magic.last_run().run_dir")
    for rank in range(4):
        with open(os.path.join(run_dir, f"rank-{rank}.log")) as f:
            assert f.read().splitlines() == [f"rank {rank} line {i}" for i in range(LINES)]

    widgets = Widgets(messages)
    assert shown_widgets(messages), "a run this long shows its dashboard"
    assert widgets.table_rows() == {k: ("done", "", "") for k in range(4)}
    # The end sends the final value of every changed widget at once, the header first (then
    # the table, the charts, one panel per rank, the button and its layout (hidden), the
    # footer); until then, at most ten a second.
    [header] = [cid for cid, st in widgets.of("HTMLModel").items()
                if "hvd_magic</b> run" in st["value"]]
    end = max(i for i, (_, cid, _) in enumerate(widgets.updates) if cid == header)
    final = len(widgets.updates) - end
    live = [t for t, _, _ in widgets.updates[:end]]
    assert len(live) >= 5, "the dashboard was hardly live"
    assert max_per_second(live) <= 10
    duration = (widgets.updates[-1][0] - widgets.updates[0][0]).total_seconds()
    assert len(widgets.updates) <= 10 * (duration + 1) + final
    # Each rank's panel ends with the tail of its log.
    for rank in range(4):
        [panel] = [v for v in widgets.html_containing(f"rank-{rank}.log") if "<pre" in v]
        assert f"rank {rank} line {LINES - 1}</pre>" in panel
        assert f"last 200 of {LINES:,} lines" in panel


BOTH_VIEWS_CELL = """\
import io
import hvd_magic
from hvd_magic.view import TextView
from hvd_magic.view.dashboard import Dashboard

class Both:
    '''Hands every call of the driver loop to two views.'''
    def __init__(self, *views):
        self.views = views
    def __getattr__(self, name):
        return lambda *args: [getattr(v, name)(*args) for v in self.views]

def work():
    import os, time
    for i in range(30):
        print("line", i, "of", os.environ["HOROVOD_RANK"])
        hvd_magic.report(step=i + 1, total=30)
        time.sleep(0.07)

text = TextView(stdout=io.StringIO(), stderr=io.StringIO())
dash = Dashboard()
hvd_magic.run(work, np=-2, view=Both(text, dash))
"""


def test_text_and_widget_views_are_fed_the_same_events(kernel):
    reply, messages = kernel.execute(BOTH_VIEWS_CELL)
    assert reply["content"]["status"] == "ok", reply["content"]
    text = kernel.value("text.stdout.getvalue()")
    table = kernel.value("dash.table.value")
    for rank in range(2):
        assert f"[rank {rank}] line 29 of {rank}" in text
        assert re.search(rf"rank {rank}( on \S+)?: done, step 30/30, 30 lines", text)
        assert rows(table)[rank] == ("done", "30", "30")
        assert f"line 29 of {rank}" in table


def test_the_launcher_does_not_import_ipywidgets_nor_the_ranks_frameworks(tmp_path):
    code = textwrap.dedent("""\
        import sys
        import hvd_magic.api, hvd_magic.launch.spark, hvd_magic.task, hvd_magic.launch.local, hvd_magic.events
        from hvd_magic.view import TextView
        def f():
            import torch
            return 1
        run = hvd_magic.api.run(f, np=-1, view=TextView(quiet=True))
        assert run.results == [1]
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('ipywidgets', 'torch')))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    # nor torch, which only the ranks import (counting the driver's GPUs cost a first --np -N
    # cell 4.3 s when it imported torch)
    assert out.stdout.strip() == "[]"


OPEN_PANEL_CELL = """\
%%horovod --np -2
import time
for i in range(40):
    print("tick", i)
    time.sleep(0.1)
"""


def test_an_opened_log_panel_is_kept_live(kernel):
    """Opening rank 1's panel mid-run (an update from the front end, handled by the subshell
    while the cell runs) makes the dashboard send that panel's tail before the run ends."""
    widgets = Widgets()
    opened = []

    def on_message(msg):
        widgets.feed(msg)
        if opened or not shown_widgets([msg]):
            return
        [accordion] = widgets.of("AccordionModel")
        kernel.kc.shell_channel.send(kernel.kc.session.msg("comm_msg", {
            "comm_id": accordion, "data": {"method": "update", "buffer_paths": [],
                                           "state": {"selected_index": 1}}}))
        # and a control message, as JupyterLab sends one for its own widget subshell
        kernel.kc.control_channel.send(kernel.kc.session.msg("list_subshell_request", {}))
        opened.append(accordion)

    reply, messages = kernel.execute(OPEN_PANEL_CELL, on_message=on_message)
    assert reply["content"]["status"] == "ok" and opened
    # The subshell handled the front end's message without telling the front end "idle", and
    # the control message's "idle" was followed by "busy" again: the kernel is busy for as long
    # as the cell runs, to a front end that shows the last status it got (the cell's own "idle"
    # comes last).
    statuses = [(m["content"]["execution_state"], m["parent_header"].get("msg_type"))
                for m in messages if m["msg_type"] == "status"]
    assert ("idle", "list_subshell_request") in statuses
    assert statuses[-1] == ("idle", "execute_request")
    assert all(later[0] == "busy" for (state, _), later in zip(statuses, statuses[1:])
               if state == "idle"), statuses
    assert not [s for s in statuses if s[1] == "comm_msg"]
    [panel_0], [panel_1] = ([cid for cid, s in widgets.of("HTMLModel").items()
                             if f"rank-{rank}.log" in s["value"] and "<pre" in s["value"]]
                            for rank in range(2))
    first_done = next(i for i, (_, _, state) in enumerate(widgets.updates)
                      if "done" in state.get("value", "") and "hvd_magic</b> run" in state["value"])
    live = widgets.updates[:first_done]
    assert [cid for _, cid, _ in live].count(panel_1) >= 2, "the open panel was not updated live"
    assert panel_0 not in [cid for _, cid, _ in live]   # closed: only brought up to date at the end
    assert "tick 39</pre>" in widgets.models[panel_0]["value"]


class Recorder:
    """A view that keeps every event, in the order the driver loop handed them over."""

    def __init__(self):
        self.events = []

    def start(self, run):
        pass

    def event(self, run, rank, event):
        self.events.append((rank, event))

    def tick(self, run):
        pass

    def finish(self, run):
        pass

    def progress(self, rank):
        return [(e["step"], e["total"], e["metrics"]) for r, e in self.events
                if r == rank and e["t"] == "progress"]


def test_tqdm_in_a_rank_drives_progress_live():
    def train():
        import time
        from tqdm import tqdm
        for _ in tqdm(range(50), desc="epoch 1"):
            time.sleep(0.03)

    recorder = Recorder()
    run = hvd_magic.run(train, np=-2, view=recorder)
    for rank in range(2):
        progress = recorder.progress(rank)
        steps = [step for step, _, _ in progress]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)  # no repeats
        assert progress[-1] == (50, 50, {"desc": "epoch 1"})
        assert any(0 < step < 50 for step in steps), "only the end was reported"
        assert (run.ranks[rank].step, run.ranks[rank].total) == (50, 50)


def test_report_is_throttled_and_its_latest_value_follows_soon():
    def work():
        import time
        import hvd_magic
        from hvd_magic.rank import reporting
        start = time.monotonic()
        for i in range(200_000):
            hvd_magic.report(step=i + 1, total=200_000, loss=1.0 / (i + 1))
        busy = time.monotonic() - start
        hvd_magic.report(step=1, total=10)
        hvd_magic.report(step=2, total=10, note="latest")   # throttled: within 0.1 s of step 1
        time.sleep(1.0)                                      # a long step, reporting nothing
        deadline = time.monotonic() + 30  # (the sender thread can run late on a loaded host)
        while reporting._channel.pending is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        # what this rank had sent before it ended: only the throttle's sender could send it
        return busy, reporting._channel.last_event

    recorder = Recorder()
    run = hvd_magic.run(work, np=-1, view=recorder)
    (busy, sent_in_the_long_step), = run.results
    progress = recorder.progress(0)
    burst = [p for p in progress if p[1] == 200_000]
    assert burst[-1] == (200_000, 200_000, {"loss": 1.0 / 200_000})
    # ten events a second at most, plus one per MAX_POINTS points (every point reaches the driver)
    from hvd_magic.rank.reporting import MAX_POINTS
    assert len(burst) <= 10 * busy + 2 + 200_000 // MAX_POINTS
    # The throttled step 2 was sent by the sender thread during the long step, not at the rank's end
    # (the order of its arrival and of a line printed after it is not the rank's: they come by
    # two pipes), and it reached the driver.
    assert sent_in_the_long_step == {"t": "progress", "step": 2, "total": 10,
                                     "metrics": {"note": "latest"}}
    assert progress[-1] == (2, 10, {"note": "latest"})


def test_a_value_reported_again_without_a_step_is_not_kept_back():
    """The same values again, after the throttle's interval and with nothing reported after
    them, are a point of their own that reaches the driver (the last values are never left
    unsent on the rank)."""
    def work():
        import time
        import hvd_magic
        hvd_magic.report(loss=0.25)
        time.sleep(0.3)
        hvd_magic.report(loss=0.25)

    run = hvd_magic.run(work, np=-1, view=Recorder())
    assert list(run.ranks[0].history) == [[1, {"loss": 0.25}], [2, {"loss": 0.25}]]


TIMELINE_CELL = """\
%%horovod --np -2 --timeline
import time, torch, horovod.torch as hvd
hvd.init()
for i in range(20):
    hvd.allreduce(torch.ones(10), name="grad")
    time.sleep(0.1)
"""


def test_timeline_is_drawn_when_the_run_ends(kernel):
    reply, messages = kernel.execute(TIMELINE_CELL)
    assert reply["content"]["status"] == "ok"
    footer = kernel.value("hvd_magic.last_run().view.footer.value")
    run_id = kernel.value("hvd_magic.last_run().id")
    assert "Horovod timeline" in footer and pictures_in(footer)
    assert f"hvd_runs/{run_id}/timeline.json" in footer
    assert Widgets(messages).html_containing("Horovod timeline")  # and the front end got it


def test_dashboard_of_a_spark_run_says_where_it_runs(kernel):
    cell = ("%%horovod --np 2\nimport time, socket\nfor i in range(20):\n"
            "    print('step', i)\n    time.sleep(0.1)\nsocket.gethostname()")
    reply, messages = kernel.execute(cell)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert shown_widgets(messages)
    header = kernel.value("hvd_magic.last_run().view.header.value")
    assert "<code>local[" in header and "done" in header
    table = kernel.value("hvd_magic.last_run().view.table.value")
    host = kernel.value("hvd_magic.last_run().value")
    assert rows(table) == {0: ("done", "", ""), 1: ("done", "", "")}
    assert table.count(f" title='{host}'>{host}</td>") == 2
    assert len(re.findall(r">cpu ×\d+</td>", table)) == 2  # a CPU rank: its threads (#43)
    # One clock from the cell's start, through Spark's start-up and the run: it never goes back.
    figures = elapsed_figures(messages)
    assert len(figures) >= 3 and figures == sorted(figures), figures


SHAPE_CELL = """\
%%horovod --np -2
import sys, time, hvd_magic
print("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
      file=sys.stderr)
print("I0000 00:00:1764000000.000000    4242 port.cc:153] oneDNN custom operations are on.",
      file=sys.stderr)
for step in range(1, 31):
    hvd_magic.report(step=step, total=30, loss=1.0 / step)  # the same on both ranks
    time.sleep(0.06)
print("x" * 300)
time.sleep(0.3)
"""


def elapsed_figures(messages):
    """Every figure of the cell's clock, in the order shown: its first line's, the dashboard's."""
    figures = []
    for m in messages:
        if m["msg_type"] in ("display_data", "update_display_data"):
            text = m["content"]["data"].get("text/html", "")
        elif m["msg_type"] == "comm_msg":
            text = m["content"]["data"].get("state", {}).get("value", "")
        else:
            continue
        figures += [float(x) for x in re.findall(r"data-elapsed>([\d.]+) s<", str(text))]
    return figures


def test_one_clock_a_table_that_keeps_its_shape_quiet_start_up_and_every_rank_seen(kernel):
    kernel.execute("import hvd_magic.view.dashboard as d; d.SHOW_AFTER, show_after = 0, d.SHOW_AFTER")
    try:
        reply, messages = kernel.execute(SHAPE_CELL)
    finally:
        kernel.execute("d.SHOW_AFTER = show_after")
    assert reply["content"]["status"] == "ok", reply["content"]
    # The cell's first output is its opening line, and the dashboard took its place.
    outputs = [m for m in messages if m["msg_type"] in ("display_data", "update_display_data",
                                                         "stream", "execute_result")]
    assert outputs[0]["msg_type"] == "display_data"
    assert "hvd_magic" in outputs[0]["content"]["data"]["text/html"]
    [shown] = shown_widgets(messages)
    assert shown["msg_type"] == "update_display_data"
    assert (shown["content"]["transient"]["display_id"]
            == outputs[0]["content"]["transient"]["display_id"])
    # One clock that only grows, ending on the cell's wall time.
    figures = elapsed_figures(messages)
    assert len(figures) >= 2 and figures == sorted(figures), figures
    ranks_time = kernel.value("hvd_magic.last_run().ended - hvd_magic.last_run().started")
    assert figures[-1] >= round(ranks_time, 1)
    # A 300-character last line keeps one line: it takes the width the other columns leave,
    # cut at its start (its end in view), whole on hover.
    view = "hvd_magic.last_run().view"
    table = kernel.value(f"{view}.table.value")
    from hvd_magic.view.table import _LAST
    assert "max-width:0" in _LAST and "direction:rtl" in _LAST and "overflow:hidden" in _LAST
    assert table.count(_LAST) == 3  # the head's and each row's
    assert table.count(f"title='{'x' * 300}'") == 2
    # TensorFlow's start-up chatter stays in the log files, out of every widget.
    widgets = Widgets(messages)
    seen = " ".join(str(st.get("value", "")) for st in widgets.models.values())
    seen += " ".join(kernel.value(f"[p.value for p in {view}.panels]"))
    assert "absl" not in seen and "oneDNN" not in seen and "x" * 300 in seen
    with open(os.path.join(kernel.value("hvd_magic.last_run().run_dir"), "rank-1.log")) as f:
        log = f.read()
    assert log.count("absl::InitializeLog") == 1 and log.count("oneDNN") == 1
    # The live charts never lag the table: drawn in the same tick, up to the same step.
    [charts] = [cid for cid, st in widgets.models.items() if "hvd-magic-charts" in str(st)
                or any(cid == c and "hvd-magic-charts" in str(u) for _, c, u in widgets.updates)]
    [table_id] = [cid for cid, st in widgets.of("HTMLModel").items() if "<tr data-rank=" in st["value"]]
    latest, checked = None, 0
    for _, cid, state in widgets.updates:
        if cid == table_id:
            latest = max(int(step or 0) for _, step, _ in rows(state["value"]).values())
        elif cid == charts and 'data-metric="' in state.get("value", ""):  # (not memory alone)
            assert f">step {latest}</text>" in state["value"]
            checked += 1
    assert checked >= 2
    # Equal values of two ranks: both lines seen (the second dashed over the first).
    # (in the static rendition that took the dashboard's place at the end)
    final = [m["content"]["data"]["text/html"] for m in messages
             if m["msg_type"] == "update_display_data" and "hvd-magic-run" in
             m["content"]["data"].get("text/html", "")]
    assert len(final) == 1
    [picture] = [p for p in static_charts(final[0]) if 'data-metric="loss"' in p]
    lines = dict(re.findall(r'<polyline data-rank="(\d)" points="[^"]+"([^>]*)>', picture))
    assert "dasharray" not in lines["0"] and "stroke-dasharray" in lines["1"]
    # A finished run has nothing to cancel: its button is gone.
    assert kernel.value(f"{view}.cancel_button.layout.display") == "none"


STACK_DUMP = ["Thread 0x00007f3a5c1ff640 (most recent call first):",
              '  File "/usr/lib/python3.11/threading.py", line 324 in wait', "",
              "Current thread 0x00007f3a6d4b2740 (most recent call first):",
              '  File "<frozen runpy>", line 198 in _run_module_as_main']


def test_a_hang_keeps_the_dashboard_readable_and_the_end_leaves_html(ip, tmp_path):
    """A real Run fed what two ranks' tasks send, drawn by the real Dashboard: the stall's
    message on a line of its own (the Cancel button keeps its place and label), a stack dump
    never a rank's last line (it stays in the log, in grey), empty columns left out, progress
    and metrics whole; at the end the display becomes HTML with the table, the charts and logs."""
    from IPython.utils.capture import capture_output
    from hvd_magic.driver.apply import apply_event
    from hvd_magic.config import RunOptions
    from hvd_magic.driver.run import Run
    from hvd_magic.view.dashboard import Dashboard

    view = Dashboard()
    run = Run(2, RunOptions(run_dir=str(tmp_path / "run")), view=view)
    run.folder.create(2)
    run.state, run.where, run.started = "running", "driver only", 1.0
    view.start(run)

    def send(event):
        apply_event(run, event, lambda reason: None)

    for r in range(2):
        send({"t": "state", "rank": r, "state": "running", "host": "h", "pid": 10 + r})
        send({"t": "lines", "rank": r, "stream": "stdout", "lines": [f"rank {r}: sum = 3.0"]})
    with capture_output():
        view._show(run)
    table = view.table.value
    assert ">progress<" not in table and ">metrics<" not in table  # empty: no room taken
    assert ">local rank<" not in table and ">host<" in table
    send({"t": "progress", "rank": 0, "step": 45, "total": 200, "metrics": {"accuracy": 0.93}})
    view._notices.append(("stall: rank 0 has been waiting in a collective " + "x " * 200, "stall"))
    for r in range(2):
        send({"t": "lines", "rank": r, "stream": "stderr", "lines": STACK_DUMP})
    header, notices = view._candidates(run)[0][1]()
    assert "stall" not in header and "stall: rank 0" in notices
    assert view.cancel_button.description == "Cancel"
    assert view.cancel_button.layout.flex == "0 0 auto"  # never squeezed by the header
    assert view.box.children[1] is view.notices  # the notices' own line, under the button's
    table = view._table_html(run)
    assert "</progress> 45/200" in table and ">accuracy=0.93<" in table and ">progress<" in table
    assert re.findall(r"<code dir='ltr'[^>]*>([^<]*)</code>", table) == [
        "rank 0: sum = 3.0", "rank 1: sum = 3.0"]
    panel = view._log_html(run, 0)
    assert "line 198 in _run_module_as_main" in panel and "color:#757575" in panel

    for r in range(2):
        send({"t": "exit", "rank": r, "code": 0, "status": "ok"})
    run.state, run.ended = "done", 3.0
    updates = []
    view.handle = type("Handle", (), {"update": lambda _, data, raw=False: updates.append(data)})()
    with capture_output() as shown:
        view.finish(run)
    [final] = updates
    assert "Error" not in final["text/html"] and "rank 1: sum = 3.0" in final["text/html"]
    assert final["text/html"].count("<details>") == 2 and "rank-1.log" in final["text/html"]
    assert "rank 1 on h: done" in final["text/plain"]
    assert not shown.outputs  # nothing else after the rendition


def test_rows_end_with_the_last_values_and_show_what_a_terminal_shows(ip, monkeypatch):
    """Real ranks, the real Dashboard (its widgets read back): each row ends with the values the
    rank reported last, though its last event said only the step (a Lightning fit's end); what
    the ranks wrote for a terminal shows as a terminal shows it, in the row, the log panels and
    the static rendition: no escape code, a redrawn line's last state, a nested bar written
    over, stderr not red, a warning and an advert never the last line."""
    from IPython.utils.capture import capture_output
    from hvd_magic import view as views
    from hvd_magic.view.table import log_html
    monkeypatch.setattr(views, "widgets_available", lambda: True)
    with capture_output() as shown:
        ip.run_cell_magic("horovod", "--np -2", TERMINAL_CELL)
    run = hvd_magic.last_run()
    view = run.view
    assert type(view).__name__ == "Dashboard" and view.box is not None
    table = view.table.value
    assert re.findall(r"<code dir='ltr'[^>]*>([^<]*)</code>", table) == [
        "rank 0: done", "rank 1: done"]
    assert table.count(">loss=0.05<") == 2
    final = [o.data["text/html"] for o in shown.outputs
             if "hvd-magic-run" in o.data.get("text/html", "")][-1]
    assert final.count(">loss=0.05<") == 2
    for rank in range(2):
        assert run.ranks[rank].metrics == {"loss": 0.05}
        panel = view.panels[rank].value
        assert "Total FLOPs: 0" in panel and "bar 100%" in panel and "Epoch 0 100%" in panel
        for gone in ("bar 50%", "check 1/2", "check 2/2", "Epoch 0 50%"):
            assert gone not in panel and gone not in final
        assert "#c62828" not in panel  # stderr is the rank's output, not an error
        assert "<span style='color:#757575'>\U0001f4a1 Tip: try our cloud</span>" in panel
    for html in (table, final, *(p.value for p in view.panels)):
        assert "\x1b" not in html and "[?25" not in html and "[1m" not in html
    # A traceback a rank prints still stands out, to its exception's line
    printed = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
               "ValueError: no", "after it"]
    panel = log_html(run, 0, [("stderr", line) for line in printed])
    assert panel.count("<span style='color:#c62828'>") == 3 and "\nafter it</pre>" in panel


def test_a_lost_and_replaced_slots_row_says_so_at_once(ip, tmp_path):
    """An elastic DDP run's slot 2 is killed and replaced, fed as the tasks send it to a real Run
    and Dashboard: the row says "lost" the moment its exit is heard; once the replacement
    starts, the row says which attempt it is and none of the dead process's lines is its last
    line; after the world re-forms, a row whose process has another rank says which, in the
    world's words (no Horovod in a run without it)."""
    from IPython.utils.capture import capture_output
    from hvd_magic.config import RunOptions
    from hvd_magic.driver.apply import apply_event
    from hvd_magic.driver.run import Run
    from hvd_magic.view.dashboard import Dashboard
    from hvd_magic.view.text import summary_text

    view = Dashboard()
    run = Run(3, RunOptions(run_dir=str(tmp_path / "run")), view=view, elastic=(2, 3, 60))
    run.folder.create(3)
    run.state, run.where, run.started = "running", "driver only", 1.0
    view.start(run)

    def send(event):
        apply_event(run, event, lambda reason: None)

    def row(rank):
        table = view._table_html(run)
        return table.split(f"<tr data-rank='{rank}'")[1].split("</tr>")[0]

    ring = {"t": "ring", "formed": "world"}
    run.elastic.ring(run, dict(ring, keys=["hvd-s0-a1", "hvd-s1-a1", "hvd-s2-a1"]))
    for r in range(3):
        send({"t": "state", "rank": r, "state": "running", "host": "h", "pid": 10 + r})
        send({"t": "lines", "rank": r, "stream": "stdout", "lines": [f"pid {10 + r} at step 19"]})
    with capture_output():
        view._show(run)
    send({"t": "exit", "rank": 2, "code": -9, "status": "died", "summary": {"signal": "SIGKILL"}})
    assert "data-state='lost'" in row(2) and ">lost<" in row(2)
    run.elastic.ring(run, dict(ring, keys=["hvd-s0-a1", "hvd-s1-a1"]))
    send({"t": "state", "rank": 2, "state": "starting", "host": "h", "pid": 99,
          "executor": "hvd-s2-a2"})
    assert "attempt 2" in row(2) and "pid 12" not in row(2), row(2)
    # the world re-forms with the new process second: slot 1 is rank 2 in it
    run.elastic.ring(run, dict(ring, keys=["hvd-s0-a1", "hvd-s2-a2", "hvd-s1-a1"]))
    assert "(2 now)" in row(1) and "(1 now)" in row(2) and " now)" not in row(0)
    text = summary_text(run)
    assert "rank 1 (rank 2 now)" in text and "Horovod" not in text, text
