"""The live per-rank dashboard of a run, drawn with ipywidgets in a Jupyter kernel.

A view like `hvd_magic.view.TextView`, fed the same calls by the driver loop (`start`, `event`,
`tick`, `finish`): a header (run id, ranks, where, state, elapsed time, a Cancel button), one table
row per rank (host, local rank, device, state, progress bar, metrics, last line), the charts, each
rank's log tail in an accordion, and at the end links to the full logs and the timeline, if one
was recorded. The run's notices (the stall watchdog's) have their own line under the header, so
that the Cancel button beside it keeps its label and place.

While it runs, its state is also kept as HTML under it, hidden while the widget is drawn
(`hvd_magic.view.rendition.Snapshot`), for a kernel that goes before the run ends: nothing the
old kernel sends reaches the page once a restart is asked for. When the run ends, the
dashboard's display is replaced by its static rendition: the same header,
table, charts (as images) and links, each rank's log tail in a ``<details>``, as plain HTML and
text. A saved notebook opened later, without the kernel that held the widgets (a colleague's,
nbviewer, GitHub), shows that rather than "Error displaying widget: model not found". So does a
background run's, whose end comes long after its cell's: JupyterLab applies a display's update
whenever it comes (checked in Chromium: tests/test_browser.py), and so does nbclient.
Above `SUMMARY_ABOVE` ranks the table is `hvd_magic.view.summary`'s summary (counts, progress
spread, a row per host, outliers pinned), the charts are mean and min-max bands, and one
`RankPicker` shows any rank's row and log instead of an accordion of a panel per rank.

How it stays cheap for the notebook:
- `event` only updates plain Python state (a bounded tail of raw lines per rank, dirty flags):
  what a line shows as (its last redraw, cut, start-up chatter left out) is worked out when it is
  drawn, since per event that was most of the view's cost at hundreds of ranks;
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
import itertools
import time
import weakref

from .summary import RankPicker, band_charts, is_large, summary_html
from .subshell import busy_after_control, hold, route_to_subshell
from .charts import picture_svg
from .opening import Opening
from .pacing import ChartRedraw, Pace
from .stacks_panel import StacksPanel, button_layout
from .rendition import (Snapshot, clock_html, final_html, live_marks, notices_html,
                        timeline_html, timeline_note)
from .table import TABLE_HEAD, footer_html, log_html, row_html, state_html, table_html
from .text import TextView

SHOW_AFTER = 1.5           # seconds before the dashboard appears (ipyparallel's --progress-after)
UPDATES_PER_SECOND = 10    # widget messages per second, for the whole dashboard
TAIL_LINES = 200           # lines of each rank's log kept for its panel
TEXT_LINES_MAX = 2000      # a run printing more before SHOW_AFTER gets the dashboard at once
CHART_INTERVAL = 0.5       # seconds between two drawings of the charts, per 256 ranks
LIVE_ONLY = "(hvd_magic's live dashboard: drawn only while its kernel runs)"


_SHOWN = weakref.WeakSet()  # the dashboards shown in this kernel (`shown_here`)


def shown_here(run):
    """Whether a dashboard of `run` was shown by the cell that runs now (a ``%%horovod
    --background`` cell, whose value is the run)."""
    cell = _cell_count()
    return any(d.shown_as == (run.id, cell) for d in list(_SHOWN))


def _cell_count():
    from IPython import get_ipython
    return getattr(get_ipython(), "execution_count", None)


class Dashboard:
    """ipywidgets view of a run; `Dashboard(quiet=True)` shows nothing at all."""

    def __init__(self, quiet=False, verbose=False, opening=None):
        self.quiet = quiet
        self.verbose = verbose       # C++ libraries' start-up chatter is shown too
        self.opening = opening or Opening()  # the cell's first output, and when the cell began
        self._ended_at = None        # when the view saw the run end (the cell's wall time)
        self._let_go = []            # what keeps the kernel "busy" to the front end, undone
        self.box = None              # the displayed VBox, once shown
        self.snapshot = None         # its state as HTML, for a kernel that goes first
        self.shown_as = None         # (run id, the cell that showed it), once shown
        self.handle = None           # its display, which the static rendition replaces at the end
        self.header = self.table = self.logs = self.footer = self.cancel_button = None
        self.notices = None          # the stall watchdog's and others' messages, under the header
        self.panels = []
        self.picker = None           # above SUMMARY_ABOVE ranks: one rank's row and log
        self.subshell_id = None      # the subshell that receives the clicks, when there is one
        self._tails = []
        self._log_dirty = set()
        self._early = []             # (rank, event) of lines while nothing is shown yet
        self._early_lines = 0
        self._started = None
        self._pace = Pace(UPDATES_PER_SECOND)
        self._pushed_at = {}
        self._cancel_clicked = False
        self._notices = []           # messages about the whole run
        self._charts = ChartRedraw(CHART_INTERVAL)

    # -- the view protocol -------------------------------------------------------------------
    def start(self, run):
        if self.quiet:
            return
        self._started = None         # when the ranks were launched, as this view saw it
        self._tails = [collections.deque(maxlen=TAIL_LINES) for _ in range(run.np)]
        if self.opening.handle is not None:
            self.opening.update(self._header_html(run) + notices_html(self._notices))
        if getattr(run, "background", False):
            # The launching cell ends at once, and output sent after a cell ended is lost in
            # JupyterLab, so a background run is shown now (widget updates reach it later).
            self._show(run)

    def event(self, run, rank, event):
        if self.quiet:
            return
        if rank is None:  # about the whole run (the stall watchdog): shown under the header
            if event.get("t") == "joined":  # a new process for a row: its own lines from now
                self._tails[event["rank"]].clear()
                self._log_dirty.add(event["rank"])
            if event.get("message"):
                self._notices.append((str(event["message"]), event.get("t")))
                if self.box is None:
                    self._early.append((rank, event))
            return
        if event.get("t") == "lines":
            lines = event.get("lines") or ()
            stream = event.get("stream", "stdout")
            # kept raw (see the module's text); chatter is left out when drawn, unless verbose
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
                if self.opening.handle is not None:  # (sent only when it changed)
                    self.opening.update(self._header_html(run) + notices_html(self._notices))
                return
            self._show(run)
        self.snapshot.refresh(run)
        now = time.monotonic()
        room = self._pace.room(now)
        for widgets, render in self._candidates(run) if room else ():
            values = render()
            changed = [(w, v) for w, v in zip(widgets, values) if w.value != v]
            if len(changed) > room:
                return  # (the table and the charts go together: next time, with room for both)
            for widget, value in changed:
                widget.value = value  # one comm message each
                self._pushed_at[widget] = now
            if changed:
                # counted from when they went, not from the look above: a slow render would
                # otherwise let the next tick's messages follow within the second
                self._pace.took(time.monotonic(), len(changed))
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
        if self.box is None or self.handle is None:  # no display to replace: a static picture
            self._show_picture(run)
        if self.box is None:
            _finish_fast(self, run)
            return
        if self.handle is None:
            self.charts.value = ""  # the static picture below the dashboard took its place
        self.header.value = self._header_html(run)
        self.notices.value = notices_html(self._notices)
        self.table.value = self._table_html(run)
        if self.picker is not None:
            self.picker.panel.value = self.picker.render()
        else:
            for rank in sorted(self._log_dirty):
                self.panels[rank].value = self._log_html(run, rank)
        self._log_dirty.clear()
        self.cancel_button.disabled = True
        self.cancel_button.layout.display = "none"  # nothing left to cancel
        self.footer.value = footer_html(run) + timeline_html(run)
        if self.handle is not None:
            self.handle.update(final_html(self, run), raw=True)
        self.snapshot.clear()

    # -- showing -----------------------------------------------------------------------------
    def _show(self, run):
        import ipywidgets as w
        from IPython.display import display

        foreground = not getattr(run, "background", False)
        if foreground:  # before the first widget: the front end's answer to it can come at once
            self._let_go.append(busy_after_control())
        # The buttons keep their size and label whatever the header says; notices go below.
        self.header = w.HTML(self._header_html(run) + live_marks(run),
                             layout=w.Layout(flex="0 1 auto", min_width="0"))
        self.stacks = StacksPanel(run)  # every rank's stack, grouped, on a click
        self.cancel_button = w.Button(description="Cancel", icon="stop", button_style="warning",
                                      tooltip="Stop every rank of this run", layout=button_layout())
        self.notices = w.HTML(notices_html(self._notices))
        self.cancel_button.on_click(lambda _button: self._on_cancel(run))
        self.table = w.HTML(self._table_html(run))
        if is_large(run):  # a thousand rows and panels would read (and draw) badly
            self.picker = RankPicker(run, self._row_html, TABLE_HEAD, self._log_html)
            self.logs = self.picker.box
        else:
            self.panels = [w.HTML(self._log_html(run, rank)) for rank in range(run.np)]
            self.logs = w.Accordion(children=self.panels,
                                    titles=tuple(f"rank {rank} log" for rank in range(run.np)))
        self._log_dirty.clear()
        self.charts = w.HTML(self._charts_html(run))
        self.footer = w.HTML("")
        self.box = w.VBox([w.HBox([self.header, self.stacks.button, self.cancel_button],
                                  layout=w.Layout(align_items="center")),
                           self.notices, self.stacks.html, self.table, self.charts, self.logs,
                           self.footer])
        self._early = []
        # Routed before it is shown, so that not even the first click can reach the busy main shell.
        clicked = [self.picker.selector, self.picker.lines] if self.picker else [self.logs]
        self.subshell_id = route_to_subshell([self.cancel_button, self.stacks.button, *clicked])
        if self.subshell_id is not None and foreground:
            self._let_go.append(hold(self.subshell_id))  # the kernel stays "busy" meanwhile
        shown = _live_bundle(self.box)
        self.handle = self.opening.replace_with(shown) or display(shown, raw=True, display_id=True)
        self.snapshot = Snapshot(self, run)  # (hidden while the widget is drawn)
        self.shown_as = (run.id, _cell_count())
        _SHOWN.add(self)

    def _on_cancel(self, run):
        # Runs in the subshell's thread while the cell runs (the main thread is in the driver loop).
        self._cancel_clicked = True
        run.cancel()

    def _candidates(self, run):
        """(widget, render) pairs that may need a message, least recently sent first."""
        # The table and the charts go together, so that the charts never lag the table.
        items = [((self.header, self.notices), lambda: (self._header_html(run) + live_marks(run),
                                                        notices_html(self._notices))),
                 ((self.table, self.charts),
                  lambda: (self._table_html(run), self._charts_html(run)))]
        if self.picker is not None:  # its one panel shows the picked rank, kept fresh
            items.append(((self.picker.panel,), lambda: (self.picker.render(),)))
            self._log_dirty.clear()
        # Panels of closed accordion sections are brought up to date when opened, or at the end.
        # Without a subshell the front end's choice of panel only arrives after the cell, so all
        # panels are kept fresh then.
        opened = getattr(self.logs, "selected_index", None)
        for rank in sorted(self._log_dirty):
            if self.subshell_id is None or rank == opened:
                items.append(((self.panels[rank],),
                              lambda rank=rank: (self._take_log(run, rank),)))
        items.sort(key=lambda item: self._pushed_at.get(item[0][0], 0.0))
        return items

    def _charts_html(self, run):
        # (a line per rank, or a large run's mean and min-max band unless lines are asked for)
        return self._charts.html(run, self.picker is not None and not self.picker.lines.value,
                                 self.opening.began_at())

    def _show_picture(self, run):
        """The final charts as a static SVG output (it replaces the live ones): what a saved
        notebook, a rendered page or a binder shows without a kernel."""
        picture = picture_svg(run.ranks, charts=band_charts(run.ranks, self.opening.began_at())
                              if is_large(run) else None, since=self.opening.began_at())
        if picture:
            from IPython.display import SVG, display
            display(SVG(data=picture))

    def _take_log(self, run, rank):
        self._log_dirty.discard(rank)
        return self._log_html(run, rank)

    # -- rendering ------------------------------------------------------------------------------
    def _header_html(self, run, seen=None):
        """The header's words; `seen`: a snapshot's time (`Snapshot`), said with the clock."""
        state = run.state
        if self._cancel_clicked and state in ("running", "preparing"):
            state = "cancelling"
        notices = ""
        if run.started is None and run.error is not None:  # ended before its ranks started
            notices = f"<div>{_e(run.error)}</div>"
        waiting = None if self._ended_at else getattr(run, "waiting", None)
        phase = (f"<span data-phase>{_e(waiting[0])}…</span>" if waiting is not None
                 else state_html(state))
        where = f" on <code>{_e(run.where)}</code>" if run.where else ""
        name = f" <b data-name>{_e(run.name)}</b>" if getattr(run, "name", None) else ""
        clock = clock_html(run, self.opening.began, self._ended_at)
        if seen is not None:
            phase, clock = f"last seen {phase} at {seen}", f"{clock} in"
        return (f"<b>hvd_magic</b> run{name} <code>{_e(run.id)}</code> · {run.np} ranks{where} "
                f"· {phase} · {clock}{notices}")

    def _table_html(self, run):
        if is_large(run):
            return summary_html(run, self._row_html, TABLE_HEAD, state_html)
        return table_html(run, self._tails, self.verbose)

    def _row_html(self, r):
        return row_html(r, self._tails[r.rank], self.verbose)

    def _log_html(self, run, rank):
        return log_html(run, rank, self._tails[rank], self.verbose)


def _live_bundle(box):
    """The widget's display; its text, where it cannot be drawn, a sentence (not a VBox's repr:
    a notebook saved after its kernel went, untrusted, shows that text)."""
    return {**box._repr_mimebundle_(), "text/plain": LIVE_ONLY}


def _finish_fast(view, run):
    """A run that ended before its dashboard showed: its header, notices and links stay in the
    cell's first output; its lines follow as plain text, as the text view prints them."""
    if run.started is None:
        view.opening.clear()  # (never started: its error says why)
    else:
        view.opening.settle(f"<div>{view._header_html(run)}</div>"
                            f"{notices_html(view._notices)}{footer_html(run)}")
    text = TextView(summary=False, verbose=view.verbose)
    for rank, event in view._early:
        if rank is not None or run.started is None:  # (notices: in the header's output)
            text.event(run, rank, event)
    view._early = []
    if getattr(run, "timeline_path", None):
        text.stdout.write(timeline_note(run))


def _e(text):
    return html.escape(str(text), quote=True)
