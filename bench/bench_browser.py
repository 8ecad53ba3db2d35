"""What the dashboard of N ranks costs a real browser: frame time while it updates, DOM size.

The scale harness (`bench_scale.py`: the real driver side, N simulated ranks) runs with the real
ipywidgets `Dashboard`; every value the dashboard pushes to a widget (header, table, charts, the
rank panel) is recorded with its time. Those updates are then replayed, at the times they were
made, into a page open in Debian's Chromium (Playwright drives it, as tests/test_browser.py does):
each widget is a `div` whose `innerHTML` takes the new value, as the HTML widget's view does.
Measured in the page: the time each update takes to apply and lay out (forced), the intervals
between animation frames while updates come (a frame over 50 ms is a visible stall), and the
number of DOM elements.

Both pictures are measured: the summary (above 16 ranks, as shipped) and, for comparison, a row
per rank (`--per-rank`, the dashboard before issue #29 at the same N).

Not measured: JupyterLab's own widget manager and comm traffic around those updates (the page is
only the dashboard), so this is the floor of what a notebook pays.

    .venv/bin/python bench/bench_browser.py [--np 64 256 1024] [--seconds 8]

Not a test: timings live here only.
"""

import argparse
import contextlib
import io
import json
import os
import pickle
import shutil
import sys
import tempfile
import time

from bench_scale import Measured, _launcher_class
from rows import row, write

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

PAGE = """<!doctype html><html><body style="font-family:sans-serif;font-size:13px">
<div id="header"></div><div id="table"></div><div id="charts"></div><div id="panel"></div>
</body></html>"""

REPLAY = """async (updates) => {
  const frames = []; let last = performance.now(); let running = true;
  const tick = (t) => { frames.push(t - last); last = t; if (running) requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
  const costs = []; let most = 0; const start = performance.now();
  for (const [at, id, html] of updates) {
    const wait = at * 1000 - (performance.now() - start);
    if (wait > 0) await new Promise(r => setTimeout(r, wait));
    const t0 = performance.now();
    document.getElementById(id).innerHTML = html;
    void document.body.offsetHeight;  // style and layout now, as the next frame would
    costs.push(performance.now() - t0);
    most = Math.max(most, document.getElementsByTagName('*').length);
  }
  await new Promise(r => setTimeout(r, 200));
  running = false;
  return {frames: frames.slice(1), costs: costs, elements: most};
}"""


class Recording(Measured):
    """The dashboard, and every value it pushed to a widget, timed."""

    def __init__(self, view):
        super().__init__(view)
        self.updates = []
        self._values = {}
        self._t0 = None

    def tick(self, run):
        super().tick(run)
        view = self.view
        if view.box is None:
            return
        if self._t0 is None:
            self._t0 = time.monotonic()
        panel = view.picker.panel if view.picker is not None else None
        for name, widget in (("header", view.header), ("table", view.table),
                             ("charts", view.charts), ("panel", panel)):
            if widget is not None and self._values.get(name) != widget.value:
                self._values[name] = widget.value
                self.updates.append((time.monotonic() - self._t0, name, widget.value))


def record(np, seconds, root):
    from hvd_magic.driver.run import Run
    from hvd_magic.config import RunOptions
    from hvd_magic.view.dashboard import Dashboard
    launcher = _launcher_class()(4, seconds, 0.2, 20, 2, 0)
    view = Recording(Dashboard())
    run = Run(np, RunOptions(run_dir=os.path.join(root, f"np{np}")), launcher=launcher,
              view=view)
    with contextlib.redirect_stdout(io.StringIO()):
        run.launch({"fn": pickle.dumps(None), "args": []}, {})
    shutil.rmtree(run.run_dir, ignore_errors=True)
    return view.updates


def replay(page, updates):
    page.set_content(PAGE)
    return page.evaluate(REPLAY, [list(u) for u in updates])


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true", help="np 64 only, 4 s")
    parser.add_argument("--json", help="write the rows here (bench/rows.py)")
    args = parser.parse_args()
    if args.quick:
        args.np, args.seconds = [64], 4.0
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"no {CHROMIUM}: sudo apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    import hvd_magic.view.summary as summary
    root = tempfile.mkdtemp(prefix="bench_browser-")
    rows = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for np in args.np:
                for picture, above in (("summary", 16), ("a row per rank", 10**9)):
                    summary.SUMMARY_ABOVE = above  # is_large() reads it at each call
                    updates = record(np, args.seconds, root)
                    got = replay(page, updates)
                    result = {"np": np, "picture": picture, "updates": len(updates),
                              "frame_p50_ms": pct(got["frames"], 0.5),
                              "frame_p99_ms": pct(got["frames"], 0.99),
                              "frame_max_ms": max(got["frames"] or [0]),
                              "update_p50_ms": pct(got["costs"], 0.5),
                              "update_p99_ms": pct(got["costs"], 0.99),
                              "elements": got["elements"], "load": os.getloadavg()[0]}
                    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                      for k, v in result.items()}), flush=True)
                    extra = dict(picture=picture, updates=len(updates), load=result["load"],
                                 elements=got["elements"])
                    rows.append(row("browser", f"frame interval while updating ({picture})", np,
                                    got["frames"], unit="ms", **extra))
                    rows.append(row("browser", f"update applied and laid out ({picture})", np,
                                    got["costs"], unit="ms", **extra))
                    for r in rows[-2:]:  # the distribution's p99 and max, not every frame
                        values = r.pop("values")
                        r["p99"], r["max"] = pct(values, 0.99), max(values or [0])
            browser.close()
    finally:
        summary.SUMMARY_ABOVE = 16
        shutil.rmtree(root, ignore_errors=True)
        write(args.json, rows)


if __name__ == "__main__":
    sys.exit(main())
