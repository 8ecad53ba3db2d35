"""A kernel restarted mid-run (issue 80, item 1), in a real kernel restarted by its kernel manager
as JupyterLab's Restart does: the run's last state was in the cell's output before the kernel went
(the dashboard's snapshot: what a saved notebook shows where the widget reads "model not found"),
and the next kernel's ``%load_ext`` in the same notebook says which run ended with the old kernel,
how far its ranks got and where its logs are, once.

JupyterLab drops the old kernel's messages as soon as it asks for a restart, so only what the
kernel sent before the restart counts here (tests/test_browser.py draws it in Chromium).
"""

import json
import re
import time

import nbformat

from test_live_view import Kernel, Widgets, text_output

RESTART_CELL = """\
%%horovod --np -2 --name trainer
import time, hvd_magic
for step in range(1, 10_000):
    hvd_magic.report(step=step, total=10_000)
    print('step', step, flush=True)
    time.sleep(0.1)
"""


def _snapshot_then_restart(kernel, steps=5, timeout=180):
    """Run RESTART_CELL until the snapshot under its dashboard shows every rank `steps` in;
    restart the kernel then. The last snapshot's data, and the widgets as sent until then."""
    kernel.kc.execute(RESTART_CELL)
    widgets, snapshot = Widgets(), None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=timeout)
        widgets.feed(msg)
        data = msg["content"].get("data") or {}
        if msg["msg_type"] in ("display_data", "update_display_data") and \
                "hvd-magic-snapshot" in data.get("text/html", ""):
            snapshot = data
            done = [int(s) for s in re.findall(r"data-step='(\d+)'", data["text/html"])]
            if len(done) == 2 and min(done) >= steps:
                kernel.km.restart_kernel(now=False)
                return snapshot, widgets
    raise AssertionError(f"no snapshot with every rank {steps} steps in: {snapshot}")


def test_a_restart_mid_run_leaves_its_last_state_and_the_next_kernel_says_how_far_it_got(
        tmp_path):
    notebook = tmp_path / "restart.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext hvd_magic"),
                nbformat.v4.new_code_cell(RESTART_CELL)]
    nbformat.write(nb, str(notebook))
    kernel = Kernel(tmp_path, env={"JPY_SESSION_NAME": str(notebook)})
    try:
        kernel.execute("import hvd_magic.view.dashboard as d; d.SHOW_AFTER = 0")
        snapshot, widgets = _snapshot_then_restart(kernel)

        # What the cell keeps: the run by name and id, each rank's row, its logs' links, and
        # words that do not claim it still runs.
        html = snapshot["text/html"]
        [run_id] = set(re.findall(r"data-run='([^']+)'", html))
        assert "<b data-name>trainer</b>" in html and run_id in html
        assert "last seen" in html and "the kernel went before the run ended" in html
        assert f"hvd_runs/{run_id}/rank-1.txt" in html
        assert re.search(r"rank 1 log</summary>.*step \d+", html, re.S)  # its log's tail
        assert "running" in snapshot["text/plain"] and "when its kernel last saw it" in \
            snapshot["text/plain"]
        # While the widget is drawn, its header hides the snapshot (one dashboard in the page),
        # and says so itself once no redraw comes.
        header = widgets.html_containing("hvd_magic</b> run")[-1]
        assert f".hvd-magic-snapshot[data-run='{run_id}']" in header
        assert "display:none" in header and "no word from its kernel" in header

        # The next kernel, loading hvd_magic in the same notebook, says what became of it.
        kernel.kc.wait_for_ready(timeout=120)
        reply, messages = kernel.execute("%load_ext hvd_magic")
        assert reply["content"]["status"] == "ok", reply["content"]
        said = " ".join(text_output(messages).split())  # (printed wrapped at 96 columns)
        assert f"run {run_id} (trainer), 2 ranks" in said, said
        assert re.search(r"rank 0 at step \d+/10000, rank 1 at step \d+/10000", said), said
        assert f"logs in hvd_runs/{run_id}/" in said
        meta = json.load(open(tmp_path / "hvd_runs" / run_id / "run.json"))
        assert meta["notebook"] == str(notebook) and "said_after_kernel" in meta
        # said once: loading again does not repeat it
        reply, messages = kernel.execute("%reload_ext hvd_magic")
        assert run_id not in text_output(messages)
    finally:
        kernel.close()


def test_a_run_of_this_kernel_or_of_another_notebook_is_not_said(tmp_path):
    """Only runs whose kernel went: not a finished run, not another notebook's, not one whose
    kernel still runs (this one)."""
    import os

    from hvd_magic.frontends.ended_runs import said

    def folder(name, **meta):
        path = tmp_path / "hvd_runs" / name
        path.mkdir(parents=True)
        (path / "run.json").write_text(json.dumps(dict(id=name, np=1, ranks=[], **meta)))

    gone = {"pid": 2**22 + 17, "ending": False}  # (above Linux's default pid_max: never alive)
    folder("a-done", state="done", notebook="n.ipynb", kernel=gone)
    folder("b-other", state="running", notebook="other.ipynb", kernel=gone)
    folder("c-alive", state="running", notebook="n.ipynb", kernel={"pid": os.getpid()})
    folder("d-killed", state="running", notebook="n.ipynb", kernel=gone)
    folder("e-restart", state="cancelled", notebook="n.ipynb", kernel=dict(gone, ending=True))
    folder("f-cancelled", state="cancelled", notebook="n.ipynb", kernel=gone)
    line = said(str(tmp_path / "hvd_runs"), {"JPY_SESSION_NAME": "n.ipynb"})
    assert re.findall(r"run (\S+),", line) == ["d-killed", "e-restart"], line
    assert "still running when the kernel went" in line
    assert "cancelled as the kernel shut down" in line
    assert said(str(tmp_path / "hvd_runs"), {"JPY_SESSION_NAME": "n.ipynb"}) is None
