"""The live per-rank dashboard of a run, drawn with ipywidgets in a Jupyter kernel.

A view like `hvd_magic.view.TextView`, fed the same calls by the driver loop (`start`, `event`,
`tick`, `finish`): a header (run id, ranks, where, state, elapsed time, a Cancel button), one table
row per rank (host, local rank, device, state, progress bar, metrics, last line), each rank's log
tail in an accordion, and at the end links to the full logs and the timeline, if one was recorded.

How it stays cheap for the notebook:
- `event` only updates plain Python state (a bounded tail per rank, dirty flags);
- widgets are written in `tick`/`finish`, one widget message per 0.1 s for the whole dashboard,
  and only for values that changed; the tail of a log is sent only while its panel is open;
- the dashboard waits until a wait before the ranks start (Spark starting) or the ranks' run has
  lasted `SHOW_AFTER` seconds: a run that ends sooner prints its lines as plain text, as
  `TextView` does, so fast cells do not flash a dashboard. Meanwhile the cell's `Opening` (shown
  by the magic at once) carries the header line, and the dashboard then takes its place.

One clock: the header says how long the cell has run, from the moment it began (the
`Opening`'s), with the phase beside it; it never goes back, and the final figure is the cell's
wall time (with the ranks' own time beside it when it differs).

While a cell runs, the kernel's main thread is busy in the driver loop, so it cannot handle a
click: the Cancel button's and the accordion's messages go to a subshell of our own, which also
keeps the kernel "busy" to the front end (`hvd_magic.view.subshell`).

Not for: the logs on disk (the driver writes every line to ``run_dir``), or talking to Spark or the
tasks; a click only calls `run.cancel()`.
"""

import collections
import html
import os
import threading
import time

from .subshell import busy_after_control, hold, route_to_subshell
from .charts import charts_html, picture_svg
from .opening import Opening
from .text import TextView, is_chatter, visible_text

SHOW_AFTER = 1.5           # seconds before the dashboard appears (ipyparallel's --progress-after)
UPDATES_PER_SECOND = 10    # widget messages per second, for the whole dashboard
TAIL_LINES = 200           # lines of each rank's log kept for its panel
TAIL_LINE_CHARS = 2000     # a longer line is cut in the panel (never in the log on disk)
TEXT_LINES_MAX = 2000      # a run printing more before SHOW_AFTER gets the dashboard at once
LAST_LINE_CHARS = 400      # sent for the last-line cell; the table cuts it to its width
# The rank table's columns (the last line takes the rest): fixed, so that a long last line or many
# metrics never reflow the table; what does not fit ends with an ellipsis (whole on hover).
COLUMNS = (("rank", "4em"), ("host", "8em"), ("local rank", "7em"), ("device", "5em"),
           ("state", "7em"), ("progress", "11em"), ("metrics", "15em"), ("last line", "auto"))
_CELL_STYLE = "padding:0 .6em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis"

_STATE_COLORS = {"done": "#2e7d32", "failed": "#c62828", "timeout": "#c62828",
                 "cancelled": "#757575", "running": "#1565c0", "starting": "#6a1b9a",
                 "preparing": "#6a1b9a"}


class Dashboard:
    """ipywidgets view of a run; `Dashboard(quiet=True)` shows nothing at all."""

    def __init__(self, quiet=False, verbose=False, opening=None):
        self.quiet = quiet
        self.verbose = verbose       # C++ libraries' start-up chatter is shown too
        self.opening = opening or Opening()  # the cell's first output, and when the cell began
        self._ended_at = None        # when the view saw the run end (the cell's wall time)
        self._let_go = []            # what keeps the kernel "busy" to the front end, undone
        self.box = None              # the displayed VBox, once shown
        self.header = self.table = self.logs = self.footer = self.cancel_button = None
        self.panels = []
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
        self._charts = ("", -1, 0.0)  # (html, points drawn, when it was drawn)
        self._chart_cost = 0.0       # seconds the last drawing took: a slow one is redrawn less

    # -- the view protocol -------------------------------------------------------------------
    def start(self, run):
        if self.quiet:
            return
        self._started = None         # when the ranks were launched, as this view saw it
        self._tails = [collections.deque(maxlen=TAIL_LINES) for _ in range(run.np)]
        if self.opening.handle is not None:
            self.opening.update(self._header_html(run))
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
            # Start-up chatter of the C++ libraries stays in the rank's log file only.
            self._tails[rank].extend((stream, visible_text(line)[:TAIL_LINE_CHARS])
                                     for line in lines[-TAIL_LINES:]
                                     if self.verbose or not is_chatter(line))
            self._log_dirty.add(rank)
            if self.box is None:
                self._early.append((rank, event))
                self._early_lines += len(lines)

    def tick(self, run):
        if self.quiet:
            return
        if self.box is None:
            if not self._due(run):
                if self.opening.handle is not None:  # (sent only when it changed)
                    self.opening.update(self._header_html(run))
                return
            self._show(run)
        now = time.monotonic()
        if now - self._last_push < 1.0 / UPDATES_PER_SECOND:
            return
        for widgets, render in self._candidates(run):
            values = render()
            changed = [(w, v) for w, v in zip(widgets, values) if w.value != v]
            for widget, value in changed:
                widget.value = value  # one comm message each
                self._pushed_at[widget] = self._last_push = now
            if changed:
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
        self._ended_at = self._ended_at or time.monotonic()
        while self._let_go:
            self._let_go.pop()()
        self._show_picture(run)
        if self.box is None:  # a fast run: its lines as plain text, as the text view prints them
            self.opening.clear()
            text = TextView(summary=False, verbose=self.verbose)
            for rank, event in self._early:
                text.event(run, rank, event)
            self._early = []
            if getattr(run, "timeline_path", None):
                text.stdout.write(self._timeline_note(run))
            return
        self.charts.value = ""  # the static picture below the dashboard took its place
        self.header.value = self._header_html(run)
        self.table.value = table_html(run, self._tails)
        for rank in sorted(self._log_dirty):
            self.panels[rank].value = log_html(run, rank, self._tails[rank])
        self._log_dirty.clear()
        self.cancel_button.disabled = True
        self.cancel_button.layout.display = "none"  # nothing left to cancel
        self.footer.value = footer_html(run) + self._timeline_html(run)

    # -- showing -----------------------------------------------------------------------------
    def _show(self, run):
        import ipywidgets as w
        from IPython.display import display

        foreground = not getattr(run, "background", False)
        if foreground:  # before the first widget: the front end's answer to it can come at once
            self._let_go.append(busy_after_control())
        self.header = w.HTML(self._header_html(run))
        self.cancel_button = w.Button(description="Cancel", icon="stop", button_style="warning",
                                      tooltip="Stop every rank of this run",
                                      layout=w.Layout(width="auto", margin="0 0 0 1em"))
        self.cancel_button.on_click(lambda _button: self._on_cancel(run))
        self.table = w.HTML(table_html(run, self._tails))
        self.charts = w.HTML(self._charts_html(run))
        self.panels = [w.HTML(log_html(run, rank, self._tails[rank])) for rank in range(run.np)]
        self._log_dirty.clear()
        self.logs = w.Accordion(children=self.panels,
                                titles=tuple(f"rank {rank} log" for rank in range(run.np)))
        self.footer = w.HTML("")
        self.box = w.VBox([w.HBox([self.header, self.cancel_button],
                                  layout=w.Layout(align_items="center")),
                           self.table, self.charts, self.logs, self.footer])
        self._early = []
        # Routed before it is shown, so that not even the first click can reach the busy main shell.
        self.subshell_id = route_to_subshell([self.cancel_button, self.logs])
        if self.subshell_id is not None and foreground:
            self._let_go.append(hold(self.subshell_id))  # the kernel stays "busy" meanwhile
        if not self.opening.replace_with(self.box):
            display(self.box)

    def _on_cancel(self, run):
        # Runs in the subshell's thread while the cell runs (the main thread is in the driver loop).
        self._cancel_clicked = True
        run.cancel()

    def _candidates(self, run):
        """(widget, render) pairs that may need a message, least recently sent first."""
        # The table and the charts go together, so that the charts never lag the table.
        items = [((self.header,), lambda: (self._header_html(run),)),
                 ((self.table, self.charts),
                  lambda: (table_html(run, self._tails), self._charts_html(run)))]
        # Panels of closed accordion sections are brought up to date when opened, or at the end.
        # Without a subshell the front end's choice of panel only arrives after the cell, so all
        # panels are kept fresh then.
        opened = self.logs.selected_index
        for rank in sorted(self._log_dirty):
            if self.subshell_id is None or rank == opened:
                items.append(((self.panels[rank],),
                              lambda rank=rank: (self._take_log(run, rank),)))
        items.sort(key=lambda item: self._pushed_at.get(item[0][0], 0.0))
        return items

    def _charts_html(self, run):
        """The charts, redrawn when new points came (with the table: the x axis never lags it),
        but if drawing them is slow, for not more than a tenth of the time."""
        drawn, points, when = self._charts
        now = time.monotonic()
        total = sum(len(r.history) for r in run.ranks)
        if total != points and now - when >= 10 * self._chart_cost:
            drawn = charts_html(run.ranks)
            self._chart_cost = time.monotonic() - now
            self._charts = drawn, total, now
        return drawn

    def _show_picture(self, run):
        """The final charts as a static SVG output (it replaces the live ones): what a saved
        notebook, a rendered page or a binder shows without a kernel."""
        picture = picture_svg(run.ranks)
        if picture:
            from IPython.display import SVG, display
            display(SVG(data=picture))

    def _take_log(self, run, rank):
        self._log_dirty.discard(rank)
        return log_html(run, rank, self._tails[rank])

    # -- rendering ------------------------------------------------------------------------------
    def _header_html(self, run):
        state = run.state
        if self._cancel_clicked and state in ("running", "preparing"):
            state = "cancelling"
        notices = "".join(f"<div style='color:#c62828'>{_e(n)}</div>" for n in self._notices)
        if run.started is None and run.error is not None:  # ended before its ranks started
            notices += f"<div>{_e(run.error)}</div>"
        waiting = None if self._ended_at else getattr(run, "waiting", None)
        phase = (f"<span data-phase>{_e(waiting[0])}…</span>" if waiting is not None
                 else _state_html(state))
        where = f" on <code>{_e(run.where)}</code>" if run.where else ""
        return (f"<b>hvd_magic</b> run <code>{_e(run.id)}</code> · {run.np} ranks{where} · "
                f"{phase} · {self._clock(run)}{notices}")

    def _clock(self, run):
        """The cell's time so far, in whole seconds (so it never goes back); at the end, its wall
        time, and the ranks' own time beside it when that is much less."""
        if self._ended_at is None:
            return f"<span data-elapsed>{int(time.monotonic() - self.opening.began)} s</span>"
        wall = self._ended_at - self.opening.began
        ranks = (run.ended - run.started) if run.started and run.ended else None
        beside = f" (ranks {ranks:.1f} s)" if ranks is not None and wall - ranks >= 1.0 else ""
        return f"<span data-elapsed>{wall:.1f} s</span>{beside}"

    def _timeline_note(self, run):
        try:
            from ..timelines.show import timeline_note
            return timeline_note(run)
        except Exception:  # (not there yet, or the file went away) the path is enough
            return f"timeline: {os.path.relpath(run.timeline_path)}\n"

    def _timeline_html(self, run):
        if not getattr(run, "timeline_path", None):
            return ""
        try:
            from ..timelines.show import timeline_html
            return timeline_html(run)
        except Exception as exc:  # a broken timeline must not hide the run's result
            return f"<div>Timeline: {_link(run.timeline_path)} (not drawn: {_e(str(exc))})</div>"


# --- renderers (plain functions of the run's state) ------------------------------------------

def table_html(run, tails):
    """The rank table: a row per rank, fixed columns; `tails` are the ranks' shown log tails."""
    cols = "".join(f"<col style='width:{width}'>" for _, width in COLUMNS)
    head = "".join(f"<th style='text-align:left;{_CELL_STYLE}'>{name}</th>"
                   for name, _ in COLUMNS)
    rows = [f"<colgroup>{cols}</colgroup><tr>{head}</tr>"]
    for r in run.ranks:
        step = "" if r.step is None else r.step
        total = "" if r.total is None else r.total
        metrics = _metrics_text(r.metrics)
        last = tails[r.rank][-1][1] if tails[r.rank] else ""
        cells = [(str(r.rank), ""), (_e(r.host or ""), r.host or ""),
                 ("" if r.local_rank is None else str(r.local_rank), ""),
                 (_e(_device(r.gpus)), ""), (_state_html(r.state), ""),
                 (_progress_html(r.step, r.total), ""), (_e(metrics), metrics),
                 (f"<code>{_e(last[:LAST_LINE_CHARS])}</code>", last)]
        rows.append(f"<tr data-rank='{r.rank}' data-state='{_e(r.state)}' data-step='{step}' "
                    f"data-total='{total}'>"
                    + "".join(f"<td style='{_CELL_STYLE}'"
                              + (f" title='{_e(title)}'" if title else "") + f">{c}</td>"
                              for c, title in cells) + "</tr>")
    return ("<table style='border-collapse:collapse;table-layout:fixed;width:100%'>"
            + "".join(rows) + "</table>")



def log_html(run, rank, tail):
    """A rank's log panel: its tail, newest line in view, and a link to the whole log."""
    total = run.ranks[rank].lines
    shown = (f"last {len(tail)} of {total} lines" if total > len(tail) else f"{total} lines")
    body = "\n".join(f"<span style='color:#c62828'>{_e(text)}</span>" if stream == "stderr"
                     else _e(text) for stream, text in tail)
    # column-reverse keeps the panel scrolled to its newest line.
    return (f"<div style='font-size:90%;color:#757575'>{shown}; full log: "
            f"{_link(run.log_path(rank))}</div>"
            "<div style='max-height:22em;overflow-y:auto;display:flex;"
            "flex-direction:column-reverse'>"
            f"<pre style='margin:0;white-space:pre-wrap'>{body}</pre></div>")


def footer_html(run):
    if run.started is None:  # never launched: no run folder
        return ""
    links = " · ".join(f"rank {rank}: {_link(run.log_path(rank))}" for rank in range(run.np))
    return f"<div>Logs in {_link(run.run_dir, os.path.relpath(run.run_dir))}: {links}</div>"


def _e(text):
    return html.escape(str(text), quote=True)


def _device(gpus):
    return "GPU " + ",".join(str(g) for g in gpus) if gpus else "cpu"


def _state_html(state):
    color = _STATE_COLORS.get(state, "#424242")
    return f"<span style='color:{color};font-weight:bold'>{_e(state)}</span>"


def _progress_html(step, total):
    if step is None:
        return ""
    if isinstance(total, (int, float)) and total > 0:
        return (f"<progress value='{min(step, total)}' max='{total}' style='width:6em'></progress>"
                f" {step}/{total}")
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
