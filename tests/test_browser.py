"""The quick start in a real browser: JupyterLab (headless, on 127.0.0.1, with a token) serving a
copy of notebooks/quickstart.ipynb, opened in Debian's Chromium driven by Playwright; the cells
are run from the Run menu, and the page itself must show the dashboard with one row per rank
reaching "done", and the cell's result.

The browser is the system's /usr/bin/chromium (installed with apt-get when missing and we are
root; never a downloaded browser): Playwright only drives it. Everything started here is ended
here, and the test checks that no process it started is left: JupyterLab and its kernel (with the
kernel's Spark) are shut down through the server's API, Chromium by Playwright.

Artifacts, in test-artifacts/ (git-ignored): browser-quickstart.png (the page) and
dashboard.png (the cell's output; docs/dashboard.png for the README is a copy of it).
"""

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import nbformat
import psutil
import pytest

from conftest import ROOT, apt_install, kernel_sockets

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-quic"]
ARTIFACTS = os.path.join(ROOT, "test-artifacts")
# The page must get there within this; the first run also starts an embedded Spark.
PAGE_TIMEOUT_MS = 150_000


@pytest.fixture(scope="module")
def chromium():
    """Debian's Chromium; installed with apt-get when missing and we may (CI runs as root)."""
    if not os.path.exists(CHROMIUM):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.skip(f"no {CHROMIUM}; install it with: sudo apt-get install -y chromium")
        apt = apt_install("chromium", "fonts-liberation", update=True)
        assert os.path.exists(CHROMIUM), f"apt-get install chromium failed: {apt.stderr[-500:]}"
    return CHROMIUM


def _request(url, method="GET", timeout=5):
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout) as r:
        return r.status, r.read()


class JupyterLab:
    """A JupyterLab server of its own: its own port, token, folders and settings."""

    def __init__(self, root):
        self.root = root
        self.token = secrets.token_hex(16)
        self.url = None  # once it listens (wait_ready): it picks a free port itself
        home = os.path.join(root, ".jupyter-home")
        # No news or update checks (no network, no toast over the screenshot); the notebook's
        # own kernel started without asking (else a "Select Kernel" dialog waits for a click).
        self._settings(home, "apputils-extension/notification",
                       {"fetchNews": "false", "checkForUpdates": False})
        self._settings(home, "notebook-extension/tracker", {"autoStartDefaultKernel": True})
        env = {k: v for k, v in os.environ.items() if k != "HVD_MAGIC_NO_WIDGETS"}
        self.runtime = os.path.join(home, "runtime")
        env.update(JUPYTER_CONFIG_DIR=os.path.join(home, "config"),
                   JUPYTER_DATA_DIR=os.path.join(home, "data"),  # no user-level kernelspecs
                   JUPYTER_RUNTIME_DIR=self.runtime,
                   JUPYTERLAB_SETTINGS_DIR=os.path.join(home, "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=os.path.join(home, "workspaces"))
        self.log = open(os.path.join(home, "jupyterlab.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             "--ServerApp.port=0", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             "--allow-root", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             # (the kernels on IPC sockets: TCP ports chosen free can be taken before they bind)
             "--KernelManager.transport=ipc", f"--KernelManager.ip={kernel_sockets()}"],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    @staticmethod
    def _settings(home, plugin, values):
        path = os.path.join(home, "settings", "@jupyterlab", plugin + ".jupyterlab-settings")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(values, f)

    def api(self, path, method="GET"):
        return _request(f"{self.url}/api/{path}?token={self.token}", method)

    def wait_ready(self, timeout=120):
        """Poll /api/status until the server answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}; see {self.log.name}")
            info = os.path.join(self.runtime, f"jpserver-{self.proc.pid}.json")  # once it listens
            try:
                with open(info) as f:
                    self.url = json.load(f)["url"].rstrip("/")
                status, _ = self.api("status")
                if status == 200:
                    return
            except (OSError, ValueError):  # no file yet, half written, or not answering yet
                pass
            time.sleep(0.2)  # (a poll interval, not a readiness signal)
        raise RuntimeError(f"JupyterLab did not answer in {timeout} s; see {self.log.name}")

    def processes(self):
        """The server and everything it started that is still alive (kernels, their Spark)."""
        try:
            server = psutil.Process(self.proc.pid)
            return [server] + server.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self):
        """Shut down through the API (kernels first, gracefully: a kernel stops its Spark)."""
        started = self.processes()
        try:
            self.api("shutdown", method="POST")
        except (urllib.error.URLError, ConnectionError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=30)
        _, alive = psutil.wait_procs(started, timeout=60)
        for proc in alive:  # still fail the test, but leave nothing running
            proc.kill()
        self.log.close()
        return alive


def quickstart_copy(folder):
    """notebooks/quickstart.ipynb, with the dashboard shown from the start of the run.

    The dashboard waits `SHOW_AFTER` (1.5 s) so that fast cells do not flash one; set to 0
    here, the test does not depend on how long the run takes.
    """
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), as_version=4)
    load = next(i for i, c in enumerate(nb.cells) if "%load_ext hvd_magic" in c.source)
    knob = nbformat.v4.new_code_cell("import hvd_magic.view.dashboard\n"
                                     "hvd_magic.view.dashboard.SHOW_AFTER = 0")
    knob.id = "browser-test-knob"
    nb.cells.insert(load + 1, knob)
    nbformat.write(nb, os.path.join(folder, "quickstart.ipynb"))


@contextlib.contextmanager
def notebook_page(folder, chromium, name, failure_png, viewport=(1400, 1000)):
    """`name` (a notebook in `folder`) open in Chromium (a window of `viewport` pixels, the file
    browser open beside the notebook as JupyterLab first shows it) on a JupyterLab of its own,
    its kernel idle and its first cell focused; the page is yielded, and everything is ended
    afterwards (a screenshot of the page to `failure_png` if the body failed)."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=PAGE_TIMEOUT_MS)
    os.makedirs(ARTIFACTS, exist_ok=True)
    lab = JupyterLab(str(folder))
    try:
        lab.wait_ready()
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(folder / "chromium-profile"), executable_path=chromium, headless=True,
                args=CHROMIUM_FLAGS, viewport=dict(zip(("width", "height"), viewport)))
            page = browser.pages[0] if browser.pages else browser.new_page()
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            try:
                page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}")
                # The notebook's kernel is connected when the status bar says so (the toolbar's
                # indicator says idle before there is a kernel: cells run then are dropped).
                expect(page.locator(".jp-StatusBar-Widget")).to_contain_text(
                    re.compile(r"Python 3.* \| Idle"))
                # Menu commands act on the focused notebook: focus it as a person would.
                page.locator(".jp-Notebook .jp-Cell").first.click()
                yield page
            except Exception:
                page.screenshot(path=os.path.join(ARTIFACTS, failure_png))
                raise
            finally:
                browser.close()
    finally:
        left_by_lab = lab.stop()
    assert not left_by_lab, f"still running after JupyterLab's shutdown: {left_by_lab}"



def live_notebook(path, *cells):
    """A notebook at `path`: the extension loaded with dashboards shown at once, then `cells`."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext hvd_magic\nimport hvd_magic.view.dashboard\n"
                                          "hvd_magic.view.dashboard.SHOW_AFTER = 0")]
    nb.cells += [nbformat.v4.new_code_cell(cell) for cell in cells]
    nbformat.write(nb, str(path))


def run_all_cells(page):
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def test_quickstart_in_chromium(tmp_path, chromium):
    from playwright.sync_api import expect

    quickstart_copy(tmp_path)
    ours_before = {p.pid for p in psutil.Process().children(recursive=True)}
    with notebook_page(tmp_path, chromium, "quickstart.ipynb",
                       "browser-quickstart-failed.png") as page:
        run_all_cells(page)
        # The dashboard: one table row per rank, each reaching "done".
        rows = page.locator(".jp-OutputArea-output tr[data-rank]")
        expect(rows).to_have_count(2)
        expect(page.locator(".jp-OutputArea-output tr[data-rank][data-state='done']")
               ).to_have_count(2)
        assert [rows.nth(i).get_attribute("data-rank") for i in range(2)] == ["0", "1"]
        header = page.locator(".jp-OutputArea-output", has_text="hvd_magic run").first
        expect(header).to_contain_text("2 ranks")
        expect(header).to_contain_text("done")
        # The cell's value (rank 0's allreduce) and every rank's, from the last cell.
        expect(page.locator(".jp-OutputArea-executeResult", has_text="3.0")).to_have_count(1)
        expect(page.get_by_text("results: [3.0, 3.0]")).to_be_visible()

        # The end of rank 0's last line, its value, is in view inside its cell (not cut).
        last = rows.nth(0).locator("td").last
        expect(last).to_contain_text("allreduce sum = 3.0")
        assert _text_end_inside(last), "the last line's end is cut"

        dashboard = page.locator(".jp-Cell", has=page.locator("tr[data-rank]")).first
        dashboard.scroll_into_view_if_needed()
        dashboard.screenshot(path=os.path.join(ARTIFACTS, "dashboard.png"))
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-quickstart.png"), full_page=True)
        save(page, tmp_path / "quickstart.ipynb")
    # Saved, and opened again by a JupyterLab of its own with a fresh kernel, untrusted (as a
    # colleague would: no signature of ours, so its HTML is sanitized): the finished dashboard is
    # still there, not "Error displaying widget".
    (tmp_path / ".jupyter-home" / "data" / "nbsignatures.db").unlink(missing_ok=True)
    with notebook_page(tmp_path, chromium, "quickstart.ipynb",
                       "browser-quickstart-reopened-failed.png") as page:
        run = page.locator(".jp-OutputArea-output", has_text="hvd_magic run").first
        expect(run).to_contain_text("2 ranks")
        expect(run.locator("table tr")).to_have_count(3)  # the head and a row per rank
        expect(run.locator("table")).to_contain_text("rank 1: allreduce sum = 3.0")
        expect(run.locator("table")).to_contain_text("done")
        expect(page.locator(".jp-OutputArea-executeResult", has_text="3.0")).to_have_count(1)
        expect(run.get_by_role("link", name="rank-1.txt")).to_have_count(1)
        assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()
        run.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-quickstart-reopened.png"))
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in ours_before and _running(p)]
    assert not left, f"processes left behind: {left}"


def _text_end_inside(cell):
    """Whether the last characters of `cell`'s text (but a trailing space) are drawn inside the
    cell's box."""
    return cell.evaluate(f"td => ({TEXT_END_INSIDE})(td)")


TEXT_END_INSIDE = """td => {
    const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
    let node = null;
    while (walker.nextNode()) node = walker.currentNode;
    const range = document.createRange(), end = node.data.trimEnd().length;
    range.setStart(node, Math.max(0, end - 3));
    range.setEnd(node, end);
    const text = range.getBoundingClientRect(), box = td.getBoundingClientRect();
    return text.width > 0 && text.left >= box.left && text.right <= box.right; }"""


def save(page, path):
    """Save the notebook (its outputs as the kernel left them) and wait until it is on disk."""
    page.locator(".jp-Notebook .jp-Cell").first.click()
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 60
    while "hvd-magic-run" not in path.read_text():
        assert time.monotonic() < deadline, f"{path} was not saved with the run's output"
        page.wait_for_timeout(250)


def _running(proc):
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


CHARTS_CELL = """\
%%horovod --np -2
import math, os, time
import hvd_magic
rank = int(os.environ["HOROVOD_RANK"])
for step in range(80):
    hvd_magic.report(step=step, total=80, loss=2.3 * math.exp(-step / 25) + 0.05 * rank,
                     accuracy=1 - math.exp(-step / (20 + 10 * rank)))
    time.sleep(0.1)
while not os.path.exists("sampled"):  # (the notebook's folder: the test writes it)
    time.sleep(0.1)
"""


KERAS_CELL = """\
%%horovod --np -2
import numpy as np, keras
import horovod.keras as hvd
import hvd_magic.keras
hvd.init()
x = np.random.default_rng(hvd.rank()).normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
model = keras.Sequential([keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
              loss="binary_crossentropy")
model.fit(x, y, epochs=3, batch_size=32, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd_magic.keras.MetricsCallback()])
print("trained; " + "a long last line " * 18)
"""


def _clock(cell):
    """The figure of the cell's clock in its header (seconds), or None before it shows one."""
    texts = cell.locator("[data-elapsed]").all_inner_texts()
    return float(texts[0].split()[0]) if texts else None


def _just_below_the_table(cell, charts):
    # (the live dashboard redraws its table's HTML ten times a second: a box asked for while the
    # widget swaps it is None, so ask again until both are drawn)
    deadline = time.monotonic() + 10
    while True:
        table = cell.locator("table:has(tr[data-rank])").first.bounding_box()
        box = charts.bounding_box()
        if (table is not None and box is not None) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert table is not None and box is not None, f"not drawn in 10 s: table {table}, charts {box}"
    return 0 <= box["y"] - (table["y"] + table["height"]) < 30


def test_live_charts_in_chromium(tmp_path, chromium):
    """The charts while the cell runs and after it, as a person sees them (screenshots in
    test-artifacts/: charts-running.png, charts-finished.png; docs/charts.png is a copy); the
    kernel says Busy all the while, and the header's clock only grows. Then a Keras run whose
    last line is 300 characters long: its rows keep one line each, and TensorFlow's start-up
    chatter is nowhere in its dashboard (keras-run.png)."""
    from playwright.sync_api import expect

    live_notebook(tmp_path / "charts.ipynb", CHARTS_CELL, KERAS_CELL)
    with notebook_page(tmp_path, chromium, "charts.ipynb", "browser-charts-failed.png") as page:
        run_all_cells(page)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        charts = cell.locator(".jp-OutputArea-output .hvd-magic-charts")
        loss = charts.locator("svg[data-metric='loss'] polyline")
        expect(loss).to_have_count(2)  # a line per rank, while the ranks still run
        running = cell.locator("tr[data-rank][data-state='running']")
        expect(running).to_have_count(2)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "charts-running.png"))
        assert _just_below_the_table(cell, charts)
        status = page.locator(".jp-StatusBar-Widget", has_text="Python 3")
        states, clock = [], []
        for _ in range(4):  # the cell runs until the test writes "sampled": the kernel is busy,
            states.append(status.first.inner_text())  # the clock goes on
            clock.append(_clock(cell))
            page.wait_for_timeout(250)
        assert running.count() == 2  # (as it must: the ranks wait for the file)
        (tmp_path / "sampled").write_text("")
        assert all("Busy" in s for s in states), states

        expect(cell.locator("tr[data-rank][data-state='done']")).to_have_count(2)
        clock.append(_clock(cell))
        assert None not in clock and clock == sorted(clock), clock
        # The finished run's static rendition has the charts in the same place, as images
        # (what a saved notebook keeps), above the logs' links; no second picture below.
        expect(charts.locator("img")).to_have_count(3)  # loss, accuracy, each rank's memory
        expect(charts.locator("svg")).to_have_count(0)
        expect(cell.locator(".jp-RenderedSVG, .jp-RenderedImage")).to_have_count(0)
        assert _just_below_the_table(cell, charts)  # where they were while running
        assert charts.bounding_box()["y"] < cell.get_by_text("Logs in").bounding_box()["y"]
        expect(cell.get_by_role("button", name="Cancel")).to_be_hidden()  # nothing to cancel
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "charts-finished.png"))

        keras = page.locator(".jp-Notebook .jp-Cell").nth(2)
        rows = keras.locator("tr[data-rank][data-state='done']")
        expect(rows).to_have_count(2)
        expect(keras.locator("tr[data-rank] td[title*='a long last line']")).to_have_count(2)
        # cut at its start: its end is in view (once the last line's update is laid out: the
        # row's state and its last line are two updates, and a loaded machine draws them apart)
        long_line = keras.locator("tr[data-rank] td[title*='a long last line']").first
        deadline = time.monotonic() + 30
        while not _text_end_inside(long_line) and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert _text_end_inside(long_line)
        keras.scroll_into_view_if_needed()
        keras.screenshot(path=os.path.join(ARTIFACTS, "keras-run.png"))
        # One line per row, whatever the last line's length: as tall as the header row.
        heights = keras.locator("table tr").evaluate_all("rs => rs.map(r => r.offsetHeight)")
        assert max(heights) < 1.6 * heights[0], heights
        keras.get_by_text("rank 0 log").click()  # the log panel too
        shown = keras.locator(".jp-OutputArea-output").all_inner_texts()
        assert "trained;" in " ".join(shown)
        assert not [t for t in shown if "absl" in t or "oneDNN" in t], shown


HANG_CELL = """\
%%horovod --np -2 --stall-timeout 3
import time
import torch, horovod.torch as hvd
hvd.init()
print(f"rank {hvd.rank()} before the collective")
if hvd.rank() == 0:
    hvd.allreduce(torch.ones(1))  # rank 1 never calls it
else:
    time.sleep(600)
"""


def test_a_hang_in_chromium(tmp_path, chromium):
    """A cell that hangs (rank 0 waits in an allreduce that rank 1 never calls): when the stall
    message shows, the Cancel button still has its label and its place, the report shows where
    each rank is (grouped stacks) and no row's last line is a line of it; Cancel stops the run."""
    from playwright.sync_api import expect

    live_notebook(tmp_path / "hang.ipynb", HANG_CELL)
    with notebook_page(tmp_path, chromium, "hang.ipynb", "browser-hang-failed.png") as page:
        run_all_cells(page)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        # (the widget's notice: the hidden snapshot beside it may hold the same text)
        expect(cell.get_by_text("stall: rank 0 has been waiting").filter(visible=True).first
               ).to_be_visible()
        cancel = cell.get_by_role("button", name="Cancel")
        expect(cancel).to_be_visible()
        expect(cancel).to_have_text(re.compile("Cancel"))
        assert cancel.evaluate("b => b.scrollWidth <= b.clientWidth"), "its label is cut"
        header = cell.get_by_text(re.compile(r"hvd_magic run \S+ · 2 ranks")).first
        assert cancel.bounding_box()["y"] < header.bounding_box()["y"] + 20  # beside it still
        # The report says where each rank is, grouped: rank 0 in the allreduce, rank 1 asleep...
        notice = cell.locator("[data-notice]").first
        expect(notice).to_contain_text(re.compile(r"rank 0: Cell In\[.*→ allreduce"))
        expect(notice).to_contain_text(re.compile(r"rank 1: Cell In\["))
        # ...and no row's last line is a line of it.
        rows = cell.locator("tr[data-rank]")
        for i in range(2):
            expect(rows.nth(i).locator("td").last).to_have_text(
                f"rank {i} before the collective")
        # A log's link looks like a link in the live dashboard too, not like the text around it.
        # (its panel, folded until then; the widget's, not the hidden snapshot's beside it)
        cell.get_by_text("rank 0 log").filter(visible=True).click()
        expect(cell.get_by_role("link", name="rank-0.txt").first).to_be_visible()
        # Both colours in one turn of the page's script, once the link shows and the theme
        # defines its colour: the click is answered by the kernel, which redraws the dashboard's
        # HTML (about 0.15 s later): a link found before that redraw and read after it is out of
        # the page, and a detached element's computed colour is ''. (Nor is a colour read before
        # the theme's CSS applies the theme's.)
        link, jupyterlabs = page.wait_for_function("""cell => {
            const link = [...cell.querySelectorAll("a")].find(
                a => a.textContent === "rank-0.txt" && a.checkVisibility());
            const theme = getComputedStyle(document.documentElement)
                .getPropertyValue("--jp-content-link-color").trim();
            if (!link || !theme) return null;
            const a = document.body.appendChild(document.createElement("a"));
            a.style.color = "var(--jp-content-link-color)";
            const colours = [getComputedStyle(link).color, getComputedStyle(a).color];
            a.remove();
            return colours; }""", arg=cell.element_handle()).json_value()
        assert link == jupyterlabs and link, (link, jupyterlabs)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "hang.png"))
        cancel.click()
        expect(cell.locator("tr[data-rank][data-state='cancelled']")).to_have_count(2)
        expect(cell.locator(".jp-OutputArea-output", has_text="RunCancelled")).to_have_count(1)


BACKGROUND_CELL = """\
%%horovod --np -2 --background
import os, sys, time, hvd_magic
rank = int(os.environ["RANK"])
for step in range(1, 31):
    hvd_magic.report(step=step, total=30, loss=round(1 / step, 4))
    time.sleep(0.1)
print(f"\\x1b[?25h\\x1b[1mrank {rank} trained\\x1b[0m", file=sys.stderr)  # as Lightning prints
"""


def test_a_background_run_saved_after_it_ended_keeps_its_end_in_chromium(tmp_path, chromium):
    """A background run ends long after its cell: its dashboard becomes the static rendition
    there all the same (final values in the rows, no terminal codes), its cell's value says
    how it ended, and a notebook saved then and reopened (no kernel of that run, untrusted)
    shows both, not "Error displaying widget"."""
    from playwright.sync_api import expect

    live_notebook(tmp_path / "background.ipynb", BACKGROUND_CELL,
                  "hvd_magic.last_run().wait(120)\nprint('ended:', hvd_magic.last_run().state)")

    def shows_its_end(page):
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        # (rows by their text: an untrusted notebook's HTML is sanitized of data- attributes)
        expect(cell.locator("table tr", has_text="done")).to_have_count(2)
        for rank in range(2):
            row = cell.locator("table tr", has_text=f"rank {rank} trained")
            expect(row).to_contain_text("done")
            expect(row).to_contain_text("0.0333")          # loss at step 30, the last value
            expect(row).to_contain_text(f"rank {rank} trained")
        expect(cell.locator(".jp-OutputArea-output", has_text=re.compile(r"<Run \S+ np=2 done>"))
               ).to_have_count(1)
        text = cell.locator(".jp-OutputArea").inner_text()
        assert "running>" not in text and "[?25h" not in text and "[1m" not in text, text
        return cell

    with notebook_page(tmp_path, chromium, "background.ipynb",
                       "browser-background-failed.png") as page:
        run_all_cells(page)
        expect(page.get_by_text("ended: done")).to_be_visible()
        shows_its_end(page)
        save(page, tmp_path / "background.ipynb")
    (tmp_path / ".jupyter-home" / "data" / "nbsignatures.db").unlink(missing_ok=True)
    with notebook_page(tmp_path, chromium, "background.ipynb",
                       "browser-background-reopened-failed.png") as page:
        cell = shows_its_end(page)
        expect(cell.get_by_role("link", name="rank-1.txt")).to_have_count(1)
        assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()
        cell.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-background-reopened.png"))


DEBUG_CELLS = [
    "%%distributed --np -2\nimport os, torch\n"
    "x = torch.arange(12.0).reshape(3, 4)\nbatch = {'w': x, 'step': 5}\n"
    "if os.environ['RANK'] == '1':\n    x @ torch.ones(5)",
    "%debug",
]


def test_debug_answers_what_a_person_asks_of_a_ranks_values_in_chromium(tmp_path, chromium):
    """A rank's shape error, then %debug in JupyterLab's own input box: the locals answer
    `p x.shape`, `p x.dtype`, `p list(batch)`, and the frame is named as the cell."""
    from playwright.sync_api import expect

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext hvd_magic")] + \
        [nbformat.v4.new_code_cell(source) for source in DEBUG_CELLS]
    nbformat.write(nb, str(tmp_path / "debug.ipynb"))
    with notebook_page(tmp_path, chromium, "debug.ipynb", "browser-debug-failed.png") as page:
        run_all_cells(page)  # (which stops at the error: the %debug cell is run by hand)
        expect(page.get_by_text("RankError: rank 1 on")).to_be_visible()
        cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
        cell.click()
        page.keyboard.press("Shift+Enter")
        # The prompt still open: an answered one stays in the page, greyed, for another 0.5 s
        # (class jp-OutputArea-stdin-hiding), and ignores what is typed into it; the answer to
        # a `p` often comes back sooner.
        box = cell.locator(".jp-OutputArea-stdin-item:not(.jp-OutputArea-stdin-hiding) "
                           ".jp-Stdin-input")
        for command, answer in [("p x.shape", "torch.Size([3, 4])"),
                                ("p x.dtype", "torch.float32"),
                                ("p list(batch)", "['w', 'step']"),
                                ("p batch['w'][0]", "[0.0, 1.0, 2.0, 3.0]"),
                                ("where", "<Cell In[2]>")]:
            expect(box).to_be_visible()
            box.fill(command)
            box.press("Enter")
            expect(cell.locator(".jp-OutputArea")).to_contain_text(answer)
        expect(box).to_be_visible()
        box.fill("q")
        box.press("Enter")
        text = cell.locator(".jp-OutputArea").inner_text()
        assert "Shown" not in text and "__cell__" not in text, text
        cell.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-debug.png"))


MEMORY_CELL = """\
%%horovod --np -2
import os, time
import hvd_magic
if os.environ["RANK"] == "1":
    ballast = b"x" * (200 << 20)  # held while the rank waits
hvd_magic.report(step=39, total=40, loss=0.003086, accuracy=0.89, val_loss=0.2345,
                 learning_rate=0.001, epoch=3)
print("epoch 3, step 39 of 40: " + "a long last line " * 8 + "ends here", flush=True)
while not os.path.exists("released"):  # (the notebook's folder: the test writes it)
    time.sleep(0.1)
"""
# (evaluated from the cell, which stays: the live table is redrawn ten times a second, and a
# table found by one call of the browser can be gone from the page by the next)
MEMORY_OF_RANK_1 = """cell => {
    const t = cell.querySelector("tr[data-rank]")?.closest("table");
    if (!t) return "";
    const column = [...t.querySelectorAll("th")].findIndex(th => th.textContent === "memory");
    const row = t.querySelector("tr[data-rank='1']");
    return column < 0 || !row ? "" : row.children[column].textContent; }"""

# Whether rank 1's memory cell and the end of its last line are drawn inside the output area, and
# whether the table scrolls sideways: read in one call, from one drawing of the table.
IN_VIEW = """cell => {
    const t = cell.querySelector("tr[data-rank]").closest("table");
    const area = t.closest(".jp-OutputArea-output").getBoundingClientRect();
    const column = [...t.querySelectorAll("th")].findIndex(th => th.textContent === "memory");
    const row = t.querySelector("tr[data-rank='1']");
    const memory = row.children[column], last = row.lastElementChild;
    const box = memory.getBoundingClientRect(), end = last.getBoundingClientRect();
    const onTop = memory.contains(document.elementFromPoint(box.left + box.width / 2,
                                                            box.top + box.height / 2));
    return {"memory": area.left <= box.left && box.right <= area.right && onTop,
            "last line": area.left <= end.left && end.right <= area.right + 1 && end.width > 80
                         && (""" + TEXT_END_INSIDE + """)(last),
            "scrolls": t.parentElement.scrollWidth > t.parentElement.clientWidth}; }"""


def _in_view(cell):
    return cell.evaluate(IN_VIEW)


def _settled_in_view(page, cell, want, seconds=15):
    """`_in_view` once the page is laid out again after a resize (and the live table, redrawn
    each second, settled): `want` as soon as it holds, else what it was at the deadline."""
    deadline = time.monotonic() + seconds
    while True:
        got = _in_view(cell)
        if got == want or time.monotonic() > deadline:
            return got
        page.wait_for_timeout(250)


def _megabytes(text):
    """The first "N MB" or "N GB" of `text`, in MB; 0 without one."""
    found = re.search(r"([\d.]+) (MB|GB)", text or "")
    return float(found.group(1)) * (1024 if found.group(2) == "GB" else 1) if found else 0


def test_a_ranks_memory_in_its_row_and_the_memory_chart_in_chromium(tmp_path, chromium):
    """Rank 1 holds 200 MB while both ranks wait for a file the test writes: its row's memory
    column says more than 150 MB, and the memory chart is with the live charts, a line per rank
    (memory.png); at the end the chart stays, as an image, in the static rendition.

    In a 1280x800 window with the file browser open, the table with every column (progress,
    five metrics, a long last line) fits the output area, its memory and the end of its last
    line in view (table-1280.png); narrower than the table can shrink to, it scrolls sideways
    and the memory and the last line's end stay in view (table-narrow.png)."""
    from playwright.sync_api import expect

    live_notebook(tmp_path / "memory.ipynb", MEMORY_CELL)
    with notebook_page(tmp_path, chromium, "memory.ipynb", "browser-memory-failed.png",
                       viewport=(1280, 800)) as page:
        expect(page.locator("#filebrowser")).to_be_visible()
        run_all_cells(page)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        expect(cell.locator("tr[data-rank][data-state='running']")).to_have_count(2)
        memory, deadline = "", time.monotonic() + 60
        while _megabytes(memory) <= 150:  # (sampled once a second, once the ballast is made)
            assert time.monotonic() < deadline, f"rank 1's memory cell: {memory!r}"
            page.wait_for_timeout(250)
            memory = cell.evaluate(MEMORY_OF_RANK_1)
        expect(cell.locator("tr[data-rank='1'] td[title*='ends here']")).to_have_count(1)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "table-1280.png"))
        assert _in_view(cell) == {"memory": True, "last line": True, "scrolls": False}
        page.set_viewport_size({"width": 1000, "height": 800})  # narrower than the table's least
        expect(page.locator("#filebrowser")).to_be_visible()
        narrow = {"memory": True, "last line": True, "scrolls": True}
        assert _settled_in_view(page, cell, narrow) == narrow
        cell.screenshot(path=os.path.join(ARTIFACTS, "table-narrow.png"))
        page.set_viewport_size({"width": 1280, "height": 800})
        charts = cell.locator(".jp-OutputArea-output .hvd-magic-charts")
        chart = charts.locator("svg[data-memory]")
        expect(chart).to_have_count(1)
        expect(chart.locator("polyline[data-rank]")).to_have_count(2)
        expect(chart).to_contain_text("memory (MB)")
        page.wait_for_timeout(3000)  # (a few more samples: lines, not dots, in the screenshot)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "memory.png"))
        (tmp_path / "released").write_text("")
        expect(cell.locator("tr[data-rank][data-state='done']")).to_have_count(2)
        expect(charts.locator("img[alt='memory (MB)']")).to_have_count(1)
        expect(charts.locator("svg")).to_have_count(0)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "memory-finished.png"))


TIMELINE_CELLS = [
    "%%horovod --np -2 --timeline-steps 3:6\n" + """\
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    if dist.get_rank() == 1:
        time.sleep(0.04)  # rank 1 comes last to every all_reduce
    optimizer.zero_grad()
    model(torch.randn(16, 32)).sum().backward()
    optimizer.step()
""",
    "%horovod_timeline",
]


def test_every_ranks_timeline_in_jupyterlab_offline_and_saved(tmp_path, chromium):
    """A DDP cell's --timeline, drawn by %horovod_timeline in JupyterLab: the verdict names rank
    1, a lane per rank with its label inside the output, the table per step and rank; nothing
    the page asks for comes from beyond this JupyterLab (offline). Saved and reopened
    untrusted, the verdict, the lanes and the table are still there."""
    from playwright.sync_api import expect

    live_notebook(tmp_path / "timeline.ipynb", *TIMELINE_CELLS)

    def shows_the_timeline(page):
        cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
        out = cell.locator(".jp-OutputArea-output").first
        expect(out).to_contain_text(re.compile(r"rank 1 arrived last at \d+ of \d+ collectives"))
        picture = out.locator("img[alt=\"every rank's steps\"]")
        expect(picture).to_be_visible()
        area, box = out.bounding_box(), picture.bounding_box()
        assert box["x"] >= area["x"] and box["x"] + box["width"] <= area["x"] + area["width"] + 1
        expect(out.locator("table tbody tr")).to_have_count(8)  # a row per step and rank
        return cell

    asked = []
    with notebook_page(tmp_path, chromium, "timeline.ipynb", "browser-timeline-failed.png",
                       viewport=(1280, 900)) as page:
        page.on("request", lambda request: asked.append(request.url))
        run_all_cells(page)
        cell = shows_the_timeline(page)
        rows = page.locator(".jp-Notebook .jp-Cell").nth(1).locator("tr[data-rank]")
        expect(rows).to_have_count(2)  # (the profiler's "profiler_stop" is no rank's last line)
        assert "profiler_" not in rows.nth(0).inner_text() + rows.nth(1).inner_text()
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "timeline-ranks.png"))
        save(page, tmp_path / "timeline.ipynb")
        lab = page.url.split("/lab/")[0]
    beyond = [url for url in asked if not url.startswith((lab, "data:", "blob:"))]
    assert not beyond, f"the page asked beyond this JupyterLab: {beyond[:5]}"
    (tmp_path / ".jupyter-home" / "data" / "nbsignatures.db").unlink(missing_ok=True)
    with notebook_page(tmp_path, chromium, "timeline.ipynb",
                       "browser-timeline-reopened-failed.png", viewport=(1280, 900)) as page:
        cell = shows_the_timeline(page)
        # (no text of the picture out of it: inline SVG would leave its texts, a jumble)
        assert "rank 0, step" not in cell.locator(".jp-OutputArea-output").first.inner_text()
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "timeline-ranks-reopened.png"))


def test_a_kernel_restarted_mid_run_leaves_its_last_state_in_chromium(tmp_path, chromium):
    """Kernel > Restart while a named run goes on: the frozen dashboard says its kernel went
    (not "running" for ever); saved and reopened (untrusted), the cell shows the run's last state
    (its name, every rank's row) where the widget reads "model not found"; the new kernel's
    %load_ext names the run, how far each rank got and its logs' folder."""
    from playwright.sync_api import expect
    from test_kernel_restart import RESTART_CELL

    path = tmp_path / "restart.ipynb"
    live_notebook(path, RESTART_CELL)
    with notebook_page(tmp_path, chromium, "restart.ipynb", "browser-restart-failed.png") as page:
        run_all_cells(page)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        expect(cell.locator("tr[data-rank][data-state='running']")).to_have_count(2)
        # one dashboard in the page: the snapshot under it is hidden while the widget is drawn
        snapshot = cell.locator(".hvd-magic-snapshot")
        expect(snapshot).to_have_count(1)
        expect(snapshot).to_be_hidden()
        expect(cell.get_by_text("no word from its kernel")).to_be_hidden()
        page.wait_for_timeout(4000)  # (a snapshot with the ranks' steps in: every 3 s)
        page.get_by_role("menuitem", name="Kernel", exact=True).click()
        page.get_by_role("menuitem", name=re.compile(r"^Restart Kernel…")).click()
        page.locator(".jp-Dialog-button.jp-mod-accept").click()  # (its "Restart")
        expect(page.locator(".jp-StatusBar-Widget")).to_contain_text(
            re.compile(r"Python 3.* \| Idle"))
        expect(cell.get_by_text("no word from its kernel")).to_be_visible(timeout=30_000)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=os.path.join(ARTIFACTS, "restart-frozen.png"))
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 60
        while "hvd-magic-snapshot" not in path.read_text():
            assert time.monotonic() < deadline, "not saved"
            page.wait_for_timeout(250)
    (tmp_path / ".jupyter-home" / "data" / "nbsignatures.db").unlink(missing_ok=True)
    with notebook_page(tmp_path, chromium, "restart.ipynb",
                       "browser-restart-reopened-failed.png") as page:
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        kept = cell.locator(".jp-OutputArea-output", has_text="last seen")
        expect(kept).to_have_count(1)
        expect(kept).to_contain_text(re.compile(r"hvd_magic run trainer \S+ · 2 ranks"))
        expect(kept).to_contain_text("the kernel went before the run ended")
        expect(kept.locator("table tr", has_text="running")).to_have_count(2)
        kept.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-restart-reopened.png"))
        # The new kernel loads hvd_magic (the first cell alone) and says what became of the run.
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.keyboard.press("Shift+Enter")
        said = page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-OutputArea-output")
        expect(said).to_contain_text(re.compile(
            r"run\s+\S+\s+\(trainer\),\s+2\s+ranks,[\s\S]*rank 0 at\s+step \d+/10000[\s\S]*"
            r"logs in hvd_runs/"))


def test_a_background_run_from_python_has_its_dashboard_in_chromium(tmp_path, chromium):
    """hvd_magic.run(..., background=True, name=...) left as a cell's value draws its dashboard
    (its name in the header, a row per rank), not a "<Run … running>" line; at its end the cell
    keeps the static rendition, and so does the notebook saved and reopened untrusted."""
    from playwright.sync_api import expect
    from test_run_display import TRAIN

    path = tmp_path / "api.ipynb"
    live_notebook(path, TRAIN + "run = hvd_magic.run(train, np=-2, background=True, "
                  "name='trainer')\nrun", "print('ended:', run.wait(120))")

    def shows_its_end(page):
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        expect(cell.locator("table tr", has_text="done")).to_have_count(2)
        expect(cell).to_contain_text(re.compile(r"hvd_magic run trainer \S+ · 2 ranks"))
        expect(cell.locator("table tr", has_text="step 30")).to_have_count(2)
        assert "<Run " not in cell.locator(".jp-OutputArea").inner_text()
        return cell

    with notebook_page(tmp_path, chromium, "api.ipynb", "browser-api-failed.png") as page:
        run_all_cells(page)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        expect(cell.get_by_role("button", name="Cancel")).to_be_visible()  # live
        expect(page.get_by_text("ended: ['trained', 'trained']")).to_be_visible()
        shows_its_end(page)
        save(page, path)
    (tmp_path / ".jupyter-home" / "data" / "nbsignatures.db").unlink(missing_ok=True)
    with notebook_page(tmp_path, chromium, "api.ipynb", "browser-api-reopened-failed.png") as page:
        cell = shows_its_end(page)
        assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()
        cell.scroll_into_view_if_needed()
        page.screenshot(path=os.path.join(ARTIFACTS, "browser-api-reopened.png"))
