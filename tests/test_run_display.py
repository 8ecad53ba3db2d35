"""Every run has its dashboard (issue 80, item 7), in a real kernel: a background run started
from Python shows one as the launching cell's value (not a ``<Run … running>`` that never
changes), ``display(run)`` shows another while it runs (its lines so far read back from the run
folder) and the static rendition after its end, and ``--name``/``name=`` is in the header."""

import re

import pytest

from test_live_view import Kernel, Widgets

TRAIN = """\
import hvd_magic
def train():
    import time
    for step in range(1, 31):
        hvd_magic.report(step=step, total=30)
        print('step', step, flush=True)
        time.sleep(0.1)
    return 'trained'
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(tmp_path_factory.mktemp("display"))
    k.execute("import hvd_magic.view.dashboard as d; d.SHOW_AFTER = 0\n" + TRAIN)
    yield k
    k.close()


def _displays(messages):
    """{display id: its latest data} of the displays the messages made and updated."""
    shown = {}
    for msg in messages:
        if msg["msg_type"] in ("display_data", "update_display_data"):
            display_id = msg["content"].get("transient", {}).get("display_id") or msg["header"][
                "msg_id"]
            shown[display_id] = msg["content"]["data"]
    return shown


def test_a_background_run_from_python_has_its_dashboard_live_then_static(kernel):
    reply, launched = kernel.execute(
        "run = hvd_magic.run(train, np=-2, background=True, name='trainer')\nrun")
    assert reply["content"]["status"] == "ok", reply["content"]
    reply, displayed = kernel.execute("display(run)")  # a second dashboard, while it runs
    assert kernel.value("run.state") == "running"  # (the display above was of a live run)
    reply, waited = kernel.execute("run.wait(120)")
    assert reply["content"]["status"] == "ok", reply["content"]
    messages = launched + displayed + waited

    widgets = Widgets(messages)
    headers = widgets.html_containing("hvd_magic</b> run")
    assert len(headers) == 2  # a header widget each
    assert all("<b data-name>trainer</b>" in h for h in headers)
    # the second one began with the lines printed before it was shown (read from the folder)
    tables = [s["value"] for s in widgets.of("HTMLModel").values() if "<tr data-rank=" in s["value"]]
    assert len(tables) == 2

    # At the end each display is the static rendition, and nothing says "running" any more.
    ends = [d for d in _displays(messages).values() if "hvd-magic-run" in d.get("text/html", "")]
    assert len(ends) == 2, _displays(messages)
    for data in ends:
        assert "<b data-name>trainer</b>" in data["text/html"]
        assert data["text/html"].count("data-state='done'") == 2
        assert "step 30" in data["text/html"]
    left = " ".join(str(d) for d in _displays(messages).values())
    assert "running>" not in left and "hvd-magic-snapshot" not in left

    # Displayed after its end: the static rendition at once.
    reply, messages = kernel.execute("display(run)")
    [data] = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert "hvd-magic-run" in data["text/html"] and "<b data-name>trainer</b>" in data["text/html"]
    assert data["text/html"].count("data-state='done'") == 2
    assert re.search(r"data-elapsed>\d+\.\d s", data["text/html"])  # its own time, not 0


def test_a_background_cells_value_is_one_line_beside_its_dashboard(kernel):
    """%%horovod --background shows its dashboard itself: its value is the one line, put right
    at the end, not a second dashboard."""
    reply, messages = kernel.execute(
        "%%horovod --np -2 --background --name mine\nimport time\ntime.sleep(1)\n")
    assert reply["content"]["status"] == "ok", reply["content"]
    reply, waited = kernel.execute("hvd_magic.last_run().wait(120)")
    widgets = Widgets(messages)
    assert len(widgets.of("VBoxModel")) == 1
    assert all("<b data-name>mine</b>" in h for h in widgets.html_containing("hvd_magic</b> run"))
    lines = [d["text/plain"] for d in _displays(messages + waited).values()
             if d.get("text/plain", "").startswith("<Run ")]
    assert len(lines) == 1 and lines[0].endswith(" done>"), lines


def test_a_run_shown_as_text_by_choice_stays_text(kernel):
    """--text asked for no dashboard: its value is the one line (put right at the end)."""
    reply, messages = kernel.execute(
        "%%horovod --np -2 --background --text\nimport time\ntime.sleep(1)\n")
    assert reply["content"]["status"] == "ok", reply["content"]
    reply, waited = kernel.execute("hvd_magic.last_run().wait(120)")
    assert not Widgets(messages + waited).of("VBoxModel")
    lines = [d["text/plain"] for d in _displays(messages + waited).values()
             if d.get("text/plain", "").startswith("<Run ")]
    assert len(lines) == 1 and lines[0].endswith(" done>"), lines
