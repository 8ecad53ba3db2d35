"""The sweep's view: a row per trial (its values, state, step, the metric's last and best, a
small curve), the best trial named, one chart of the metric against step for every trial; in
the notebook with Stop per trial and for the sweep, and a trial's own dashboard (its ranks)
opened from its row. The text view says each trial's changes as lines and the table at the end.

Both views read the `Sweep`; neither reaches into its runs' launchers. At the end the widget
view's display is replaced by static HTML, which a saved notebook keeps.

Not for: a run's own view (`hvd_magic.view`), which a trial's row opens.
"""

import html
import sys
import time

from ..view import widgets_available
from ..view.charts import chart_svg

REDRAW_EVERY = 0.5     # seconds between two redraws of the widget view


def make_sweep_view(widgets=None, quiet=False, background=False):
    if quiet:
        return None
    if widgets is None:
        widgets = widgets_available()
    return WidgetSweepView(background) if widgets else TextSweepView()


def _values(trial):
    return ", ".join(f"{k}={v!r}" for k, v in trial.values.items())


def _number(value):
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def state_text(trial):
    if trial.state == "waiting":
        return "waiting" + (f" ({trial.waiting_for})" if trial.waiting_for else "")
    if trial.state == "stopped":
        return f"stopped at step {trial.stopped_at}" if trial.stopped_at is not None \
            else "stopped"
    if trial.state == "failed" and trial.error is not None:
        first = (str(trial.error).strip().splitlines() or [""])[-1]
        return f"failed: {type(trial.error).__name__}" + (f": {first}" if first else "")
    return trial.state


class TextSweepView:
    """A line per trial change; the table and the best trial at the end."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.said = {}

    def start(self, sweep):
        print(f"[hvd_magic] {sweep.id}: {len(sweep.trials)} trials of {sweep.ranks} ranks, "
              f"{sweep.slots.total} {sweep.slots.what} shared"
              + (f", at most {sweep.trials_at_once} at once" if sweep.trials_at_once else ""),
              file=self.out)

    def tick(self, sweep):
        for trial in sweep.trials:
            text = state_text(trial)
            if trial.state == "waiting" and trial.number not in self.said:
                continue  # (said when it starts)
            if self.said.get(trial.number) != text:
                self.said[trial.number] = text
                print(f"[trial {trial.number}] {_values(trial)}: {text}", file=self.out)

    def finish(self, sweep):
        self.tick(sweep)
        print(table_text(sweep), file=self.out)


def table_text(sweep):
    rows = sweep.rows()
    if not rows:
        return ""
    keys = [k for k in rows[0] if k != "run" and any(r[k] is not None for r in rows)]
    cells = [[_number(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
    best = sweep.best
    if best is not None:
        lines.append(f"best: trial {best.trial.number} ({_values(best.trial)}), "
                     f"{sweep.metric} {_number(best.value)}")
    return "\n".join(lines)


def sparkline(curve, width=80, height=18):
    if len(curve) < 2:
        return ""
    steps, values = [s for s, _ in curve], [v for _, v in curve]
    lo, hi, first, last = min(values), max(values), steps[0], steps[-1]
    span, run = (hi - lo) or 1.0, (last - first) or 1
    points = " ".join(f"{(s - first) / run * width:.1f},{height - (v - lo) / span * height:.1f}"
                      for s, v in curve)
    return (f'<svg width="{width}" height="{height}"><polyline points="{points}" fill="none" '
            f'stroke="#1f77b4" stroke-width="1.2"/></svg>')


def table_html(sweep):
    """The sweep's table and chart as HTML (live, and the static rendition)."""
    best = sweep.best
    head = "".join(f"<th>{html.escape(h)}</th>" for h in (
        "trial", *sweep.params, "state", "step", sweep.metric, f"best {sweep.metric}", "curve",
        "run"))
    body = []
    for t in sweep.trials:
        mark = ' style="font-weight:bold"' if best is not None and best.trial is t else ""
        cells = [str(t.number), *(_number(t.values.get(p)) for p in sweep.params),
                 state_text(t), _number(t.step), _number(t.last),
                 _number(t.best_value(sweep.mode))]
        row = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        row += f"<td>{sparkline(t.curve)}</td><td>{html.escape(t.run.id if t.run else '')}</td>"
        body.append(f"<tr{mark}>{row}</tr>")
    said = (f"<p>best: trial {best.trial.number} ({html.escape(_values(best.trial))}), "
            f"{html.escape(sweep.metric)} {_number(best.value)}</p>" if best else "")
    curves = {t.number: t.curve for t in sweep.trials if t.curve}
    chart = chart_svg(sweep.metric, curves, label="trial") if curves else ""
    return (f"<div><b>{html.escape(sweep.id)}</b> ({sweep.state}; {sweep.slots.total} "
            f"{html.escape(sweep.slots.what)})<table><tr>{head}</tr>{''.join(body)}</table>"
            f"{said}{chart}</div>")


class WidgetSweepView:
    """ipywidgets: the table and chart (an HTML widget), Stop per trial and for the sweep, a
    trial's own dashboard opened below; at the end the static HTML. While a foreground sweep's
    cell runs, the clicks go to a subshell of ours (`hvd_magic.view.subshell`, as the run's
    dashboard does), the kernel still busy to the front end."""

    def __init__(self, background=False):
        import ipywidgets as widgets
        self.w = widgets
        self.background = background
        self._let_go = []            # what keeps the kernel "busy" to the front end, undone
        self.page = widgets.HTML()
        self.stop_all = widgets.Button(description="Stop sweep", button_style="danger")
        self.picker = widgets.Dropdown(description="trial", options=[])
        self.stop_one = widgets.Button(description="Stop trial")
        self.open_one = widgets.Button(description="Open its ranks")
        self.opened = widgets.Output()
        self.box = widgets.VBox([self.page, widgets.HBox(
            [self.picker, self.stop_one, self.open_one, self.stop_all]), self.opened])
        self.handle = None
        self.drawn = 0.0

    def start(self, sweep):
        from IPython.display import display

        from ..view.subshell import busy_after_control, hold, route_to_subshell
        if not self.background:  # before the first widget: the front end answers it at once
            self._let_go.append(busy_after_control())
        self.picker.options = [(f"{t.number}: {_values(t)}", t.number) for t in sweep.trials]
        self.picker.value = 0 if sweep.trials else None
        self.stop_all.on_click(lambda _: sweep.cancel())
        self.stop_one.on_click(lambda _: sweep.stop_trial(self.picker.value))
        self.open_one.on_click(lambda _: self._open(sweep, self.picker.value))
        subshell = route_to_subshell([self.stop_all, self.stop_one, self.open_one, self.picker])
        if subshell is not None and not self.background:
            self._let_go.append(hold(subshell))
        self.handle = display(self.box, display_id=True)
        self.tick(sweep, force=True)

    def _open(self, sweep, number):
        trial = sweep.trials[number]
        with self.opened:
            self.opened.clear_output()
            if trial.run is None:
                print(f"trial {number} has not started ({state_text(trial)}).")
            else:
                from IPython.display import display
                display(trial.run)

    def tick(self, sweep, force=False):
        now = time.monotonic()
        if force or now - self.drawn >= REDRAW_EVERY:
            self.drawn = now
            self.page.value = table_html(sweep)

    def finish(self, sweep):
        from IPython.display import HTML
        while self._let_go:
            self._let_go.pop()()
        page = table_html(sweep)
        self.page.value = page
        if self.handle is not None:  # (what a saved notebook keeps)
            self.handle.update(HTML(page))
