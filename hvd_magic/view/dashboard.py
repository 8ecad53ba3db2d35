"""The live per-rank dashboard of a run, drawn with ipywidgets in a Jupyter kernel.

A view like `hvd_magic.view.TextView`, fed the same calls by the driver loop (`start`, `event`,
`tick`, `finish`): a header (run id, ranks, where, state, elapsed time, a Cancel button), one table
row per rank (host, local rank, device, state, progress bar, metrics, last line), each rank's log
tail in an accordion, and at the end links to the full logs and the timeline, if one was recorded.

How it stays cheap for the notebook:
- `event` only updates plain Python state (a bounded tail per rank, dirty flags);
- widgets are written in `tick`/`finish`, one widget message per 0.1 s for the whole dashboard,
  and only for values that changed; the tail of a log is sent only while its panel is open;
- nothing is shown until a wait before the ranks start (Spark starting) or the ranks' run has
  lasted `SHOW_AFTER` seconds: a run that ends sooner prints its lines as
  plain text, as `TextView` does, so fast cells do not flash a dashboard.

While a cell runs, the kernel's main thread is busy in the driver loop, so it cannot handle a
click. With ipykernel 7's subshells (JEP 91) the Cancel button's and the accordion's messages are
routed to a subshell of our own, whose thread handles them at once (see `hvd_magic.view.subshell`).

Not for: the logs on disk (the driver writes every line to ``run_dir``), or talking to Spark or the
tasks; a click only calls `run.cancel()`.
"""

import collections
import html
import itertools
import os
import time

from .summary import (SUMMARY_ABOVE, RankPicker, band_charts, band_charts_html, is_large,
                      summary_html)
from .subshell import route_to_subshell
from .charts import charts_html, picture_svg
from .text import TextView, is_cxx_info, visible_text

SHOW_AFTER = 1.5           # seconds before the dashboard appears (ipyparallel's --progress-after)
UPDATES_PER_SECOND = 10    # widget messages per second, for the whole dashboard
TAIL_LINES = 200           # lines of each rank's log kept for its panel
TAIL_LINE_CHARS = 2000     # a longer line is cut in the panel (never in the log on disk)
TEXT_LINES_MAX = 2000      # a run printing more before SHOW_AFTER gets the dashboard at once
LAST_LINE_CHARS = 120
CHART_INTERVAL = 0.5       # seconds between two drawings of the live charts

_HEAD = "<tr>" + "".join(f"<th style='text-align:left;padding:0 .6em'>{h}</th>" for h in (
    "rank", "host", "local rank", "device", "state", "progress", "metrics", "last line")) + "</tr>"
_STATE_COLORS = {"done": "#2e7d32", "failed": "#c62828", "timeout": "#c62828",
                 "cancelled": "#757575", "running": "#1565c0", "starting": "#6a1b9a",
                 "preparing": "#6a1b9a"}


class Dashboard:
    """ipywidgets view of a run; `Dashboard(quiet=True)` shows nothing at all."""

    def __init__(self, quiet=False, verbose=False):
        self.quiet = quiet
        self.verbose = verbose       # C++ libraries' INFO lines may be a rank's "last line" too
        self.box = None              # the displayed VBox, once shown
        self.header = self.table = self.logs = self.footer = self.cancel_button = None
        self.panels = []
        self.picker = None           # above SUMMARY_ABOVE ranks: one rank's row and log
        self.subshell_id = None      # the subshell that receives the clicks, when there is one
        self._tails = []
        self._log_dirty = set()
        self._early = []             # (rank, event) of lines while nothing is shown yet
        self._early_lines = 0
        self._started = None
        self._last_push = 0.0
        self._pushed_at = {}
        self._cancel_clicked = False
        self._notices = []           # messages about the whole run
        self._charts = ("", -1, 0.0)  # (html, points drawn, when): charts redrawn 2/s at most

    # -- the view protocol -------------------------------------------------------------------
    def start(self, run):
        if self.quiet:
            return
        self._started = None         # when the ranks were launched, as this view saw it
        self._tails = [collections.deque(maxlen=TAIL_LINES) for _ in range(run.np)]
        if getattr(run, "background", False):
            # The launching cell ends at once, and output sent after a cell ended is lost in
            # JupyterLab, so a background run is shown now (widget updates reach it later).
            self._show(run)

    def event(self, run, rank, event):
        if self.quiet:
            return
        if rank is None:  # about the whole run (the stall watchdog): shown under the header
            if event.get("message"):
                self._notices.append(str(event["message"]))
                if self.box is None:
                    self._early.append((rank, event))
            return
        if event.get("t") == "lines":
            lines = event.get("lines") or ()
            stream = event.get("stream", "stdout")
            # kept raw: what a panel shows of a line is worked out when it is drawn (per event,
            # that was most of the view's cost at hundreds of ranks)
            self._tails[rank].extend(zip(itertools.repeat(stream), lines[-TAIL_LINES:]))
            self._log_dirty.add(rank)
            if self.box is None:
                self._early.append((rank, event))
                self._early_lines += len(lines)

    def tick(self, run):
        if self.quiet:
            return
        if self.box is None:
            if not self._due(run):
                return
            self._show(run)
        now = time.monotonic()
        if now - self._last_push < 1.0 / UPDATES_PER_SECOND:
            return
        for widget, render in self._candidates(run):
            value = render()
            if widget.value != value:
                widget.value = value  # one comm message
                self._pushed_at[widget] = self._last_push = now
                return

    def _due(self, run):
        """Shown once a wait before the ranks, or the ranks' run itself, lasts SHOW_AFTER."""
        waiting = getattr(run, "waiting", None)
        if waiting is not None:
            return waiting[1] >= SHOW_AFTER
        if run.started is None:  # preparing, with nothing slow to say
            return False
        if self._started is None:
            self._started = time.monotonic()
        return (time.monotonic() - self._started >= SHOW_AFTER
                or self._early_lines > TEXT_LINES_MAX)

    def finish(self, run):
        if self.quiet:
            return
        self._show_picture(run)
        if self.box is None:  # a fast run: its lines as plain text, as the text view prints them
            text = TextView(summary=False, verbose=self.verbose)
            for rank, event in self._early:
                text.event(run, rank, event)
            self._early = []
            if getattr(run, "timeline_path", None):
                text.stdout.write(_timeline_note(run))
            return
        self.charts.value = ""  # the static picture below the dashboard took its place
        self.header.value = self._header_html(run)
        self.table.value = self._table_html(run)
        for rank in sorted(self._log_dirty):
            if self.picker is None:
                self.panels[rank].value = self._log_html(run, rank)
        if self.picker is not None:
            self.picker.panel.value = self.picker.render()
        self._log_dirty.clear()
        self.cancel_button.disabled = True
        self.footer.value = self._footer_html(run) + _timeline_html(run)

    # -- showing -----------------------------------------------------------------------------
    def _show(self, run):
        import ipywidgets as w
        from IPython.display import display

        self.header = w.HTML(self._header_html(run))
        self.cancel_button = w.Button(description="Cancel", icon="stop", button_style="warning",
                                      tooltip="Stop every rank of this run",
                                      layout=w.Layout(width="auto", margin="0 0 0 1em"))
        self.cancel_button.on_click(lambda _button: self._on_cancel(run))
        self.table = w.HTML(self._table_html(run))
        if is_large(run):  # a thousand rows and panels would read (and draw) badly
            self.picker = RankPicker(run, self._row_html, _HEAD, self._log_html)
            self.logs = self.picker.box
        else:
            self.panels = [w.HTML(self._log_html(run, rank)) for rank in range(run.np)]
            self.logs = w.Accordion(children=self.panels,
                                    titles=tuple(f"rank {rank} log" for rank in range(run.np)))
        self._log_dirty.clear()
        self.charts = w.HTML(self._charts_html(run))
        self.footer = w.HTML("")
        self.box = w.VBox([w.HBox([self.header, self.cancel_button],
                                  layout=w.Layout(align_items="center")),
                           self.table, self.charts, self.logs, self.footer])
        self._early = []
        # Routed before it is shown, so that not even the first click can reach the busy main shell.
        self.subshell_id = route_to_subshell(
            [self.cancel_button, *([self.picker.selector, self.picker.lines] if self.picker
                                   else [self.logs])])
        display(self.box)

    def _on_cancel(self, run):
        # Runs in the subshell's thread while the cell runs (the main thread is in the driver loop).
        self._cancel_clicked = True
        run.cancel()

    def _candidates(self, run):
        """(widget, render) pairs that may need a message, least recently sent first."""
        items = [(self.header, lambda: self._header_html(run)),
                 (self.table, lambda: self._table_html(run)),
                 (self.charts, lambda: self._charts_html(run))]
        # Panels of closed accordion sections are brought up to date when opened, or at the end.
        # Without a subshell the front end's choice of panel only arrives after the cell, so all
        # panels are kept fresh then.
        if self.picker is not None:
            items.append((self.picker.panel, self.picker.render))
            self._log_dirty.clear()
        opened = getattr(self.logs, "selected_index", None)
        for rank in sorted(self._log_dirty):
            if self.subshell_id is None or rank == opened:
                items.append((self.panels[rank], lambda rank=rank: self._take_log(run, rank)))
        items.sort(key=lambda item: self._pushed_at.get(item[0], 0.0))
        return items

    def _charts_html(self, run):
        """The charts, redrawn when new points came and half a second has passed."""
        drawn, points, when = self._charts
        now = time.monotonic()
        total = sum(len(r.history) for r in run.ranks)
        # (a large run's charts read every rank's points: redrawn less often, ~40 ms at 1024)
        if total != points and now - when >= CHART_INTERVAL * max(1, run.np / 256):
            draw = charts_html
            if self.picker is not None and not self.picker.lines.value:
                draw = band_charts_html  # mean and min-max band across ranks
            self._charts = drawn, points, when = draw(run.ranks), total, now
        return drawn

    def _show_picture(self, run):
        """The final charts as a static SVG output (it replaces the live ones): what a saved
        notebook, a rendered page or a binder shows without a kernel."""
        picture = picture_svg(run.ranks, charts=band_charts(run.ranks)
                              if is_large(run) else None)
        if picture:
            from IPython.display import SVG, display
            display(SVG(data=picture))

    def _take_log(self, run, rank):
        self._log_dirty.discard(rank)
        return self._log_html(run, rank)

    # -- rendering (plain functions of the run's state) --------------------------------------
    def _header_html(self, run):
        state = run.state
        if self._cancel_clicked and state in ("running", "preparing"):
            state = "cancelling"
        elapsed = f"{run.elapsed:.1f} s" if run.ended else f"{run.elapsed:.0f} s"
        notices = "".join(f"<div style='color:#c62828'>{_e(n)}</div>" for n in self._notices)
        if run.started is None and run.error is not None:  # ended before its ranks started
            notices += f"<div>{_e(run.error)}</div>"
        waiting = getattr(run, "waiting", None)
        if waiting is not None:  # before the ranks start: what it waits on, and for how long
            where = f"· {_e(waiting[0])}… {waiting[1]:.0f} s"
        else:
            where = f"on <code>{_e(run.where or '?')}</code>"
        return (f"<b>hvd_magic</b> run <code>{_e(run.id)}</code> · {run.np} ranks {where} · "
                f"{_state_html(state)} · {elapsed}{notices}")

    def _table_html(self, run):
        if is_large(run):
            return summary_html(run, self._row_html, _HEAD, _state_html)
        rows = [_HEAD] + [self._row_html(r) for r in run.ranks]
        return "<table style='border-collapse:collapse'>" + "".join(rows) + "</table>"

    def _row_html(self, r):
        step = "" if r.step is None else r.step
        total = "" if r.total is None else r.total
        cells = [str(r.rank), _e(r.host or ""), "" if r.local_rank is None else str(r.local_rank),
                 _e(_device(r.gpus)), _state_html(r.state), _progress_html(r.step, r.total),
                 _e(_metrics_text(r.metrics)), self._last_line_html(r.rank)]
        return (f"<tr data-rank='{r.rank}' data-state='{_e(r.state)}' data-step='{step}' "
                f"data-total='{total}'>"
                + "".join(f"<td style='padding:0 .6em'>{c}</td>" for c in cells) + "</tr>")

    def _last_line_html(self, rank):
        tail = self._tails[rank]
        text = next((_shown(line) for _, line in reversed(tail)
                     if self.verbose or not is_cxx_info(_shown(line))), "")
        if len(text) > LAST_LINE_CHARS:
            text = text[:LAST_LINE_CHARS] + "…"
        return f"<code>{_e(text)}</code>"

    def _log_html(self, run, rank):
        tail = self._tails[rank]
        total = run.ranks[rank].lines
        shown = (f"last {len(tail)} of {total} lines" if total > len(tail) else f"{total} lines")
        body = "\n".join(f"<span style='color:#c62828'>{_e(_shown(text))}</span>"
                         if stream == "stderr" else _e(_shown(text)) for stream, text in tail)
        # column-reverse keeps the panel scrolled to its newest line.
        return (f"<div style='font-size:90%;color:#757575'>{shown}; full log: "
                f"{_link(run.log_path(rank))}</div>"
                "<div style='max-height:22em;overflow-y:auto;display:flex;"
                "flex-direction:column-reverse'>"
                f"<pre style='margin:0;white-space:pre-wrap'>{body}</pre></div>")

    def _footer_html(self, run):
        if run.started is None:  # never launched: no run folder
            return ""
        links = " · ".join(f"rank {rank}: {_link(run.log_path(rank))}" for rank in range(run.np)
                           if rank < SUMMARY_ABOVE or rank == run.np - 1)
        return f"<div>Logs in {_link(run.run_dir, os.path.relpath(run.run_dir))}: {links}</div>"


def _timeline_note(run):
    try:
        from ..timelines.show import timeline_note
        return timeline_note(run)
    except Exception:  # (not there yet, or the file went away) the path is enough
        return f"timeline: {os.path.relpath(run.timeline_path)}\n"

def _timeline_html(run):
    if not getattr(run, "timeline_path", None):
        return ""
    try:
        from ..timelines.show import timeline_html
        return timeline_html(run)
    except Exception as exc:  # a broken timeline must not hide the run's result
        return f"<div>Timeline: {_link(run.timeline_path)} (not drawn: {_e(str(exc))})</div>"


# --- small renderers ---------------------------------------------------------------------------

def _e(text):
    return html.escape(str(text), quote=True)


def _shown(line):
    """What a panel shows of a line: its last redraw, cut at TAIL_LINE_CHARS."""
    return visible_text(line)[:TAIL_LINE_CHARS]


def _device(gpus):
    return "GPU " + ",".join(str(g) for g in gpus) if gpus else "cpu"


def _state_html(state):
    color = _STATE_COLORS.get(state, "#424242")
    return f"<span style='color:{color};font-weight:bold'>{_e(state)}</span>"


def _progress_html(step, total):
    if step is None:
        return ""
    if isinstance(total, (int, float)) and total > 0:
        return (f"<progress value='{min(step, total)}' max='{total}' style='width:8em'></progress> "
                f"{step}/{total}")
    return f"step {_e(step)}"


def _metrics_text(metrics):
    parts = []
    for key, value in metrics.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        parts.append(f"{key}={value}")
    return "  ".join(parts)


def _link(path, text=None):
    """A link relative to the kernel's folder, which JupyterLab resolves against the notebook's."""
    rel = os.path.relpath(path)
    return f"<a href='{_e(rel)}' target='_blank'>{_e(text or os.path.basename(path))}</a>"
