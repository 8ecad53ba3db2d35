"""The dashboard as plain HTML: its final rendition, put in the widget's place when the run ends,
and its `Snapshot`, the last state kept in the cell while the run goes on, for the day its kernel
goes first.

Why a snapshot: a widget is drawn from a model that lives in the kernel. When the kernel restarts
or dies mid-run, nothing it sends any more reaches the page (JupyterLab drops the old kernel's
messages as soon as it asks for the restart), so the final rendition never comes; a notebook saved
then and opened again shows only "Error displaying widget: model not found". So a second output
under the dashboard holds its state as HTML, refreshed every `SNAPSHOT_EVERY` seconds while the run
goes on, and emptied at the run's end (the rendition has taken the widget's place by then). While
the widget is drawn, a ``<style>`` in its header hides that output (the page shows the dashboard
once); opened again without the widget, the notebook shows the snapshot. In the page that saw the
kernel go, the frozen header says so itself: each redraw of the header starts a CSS animation that
ends `STALE_AFTER` seconds later with a note, and a live header is redrawn every second (its clock).

Not for: the widgets (`hvd_magic.view.dashboard`), or what the next kernel says of such a run
(`hvd_magic.frontends.ended_runs`, from the run folder).
"""

import html
import os
import time

from .charts import chart_svgs, charts_box
from .summary import band_charts
from .table import footer_html, link_html, log_html
from .text import summary_text

STATIC_LOG_LINES = 50      # lines of each rank's log kept in the finished run's rendition
SNAPSHOT_LOG_LINES = 20    # ...and in the snapshot, sent again every SNAPSHOT_EVERY seconds
SNAPSHOT_EVERY = 3.0       # seconds between two refreshes of the snapshot (more if it is slow)
STALE_AFTER = 12           # seconds without a redraw before the header says its kernel is gone

_NOTICE_COLOURS = {"ring": "#1565c0", "joined": "#2e7d32", "note": "#e65100"}


def final_html(view, run):
    """A finished run's dashboard as HTML (and text), put in its place: the header, the table,
    the charts, each rank's log tail, the links. A saved notebook keeps it where a widget
    would read "model not found" once the kernel is gone; only HTML that a viewer keeps in an
    untrusted notebook (no inline SVG, no scripts, no data- attributes needed)."""
    large = view.picker is not None
    since = view.opening.began_at()
    charts = band_charts(run.ranks, since) if large else chart_svgs(run.ranks, since)
    markup = (f"<div class='hvd-magic-run' data-run='{_e(run.id)}'>"
              f"<div>{view._header_html(run)}</div>{notices_html(view._notices)}"
              f"{view._table_html(run)}{charts_box(charts, static=True)}"
              f"{_logs_html(view, run, STATIC_LOG_LINES)}"
              f"{footer_html(run) + timeline_html(run)}</div>")
    return {"text/html": markup, "text/plain": summary_text(run, per_rank=not large)}


def _logs_html(view, run, lines):
    if view.picker is not None:  # the picked rank's row and log
        return (f"<details><summary>rank {view.picker.rank}</summary>"
                f"{view.picker.render()}</details>")
    return "".join(f"<details><summary>rank {rank} log</summary>"
                   f"{log_html(run, rank, view._tails[rank], view.verbose, lines)}</details>"
                   for rank in range(run.np))


def live_marks(run):
    """What a live header carries besides its words: the style that hides the run's snapshot
    while the widget is drawn, and the note that shows when no redraw came for `STALE_AFTER`
    seconds (each redraw is new elements, whose animation starts again)."""
    run_id = _e(run.id)
    return (f"<style>.jp-OutputArea-child:has(.hvd-magic-snapshot[data-run='{run_id}'])"
            f"{{display:none}}"
            f"@keyframes hvd-magic-stale{{from{{font-size:0}}to{{font-size:1em}}}}</style>"
            f"<span class='hvd-magic-stale' style='font-size:0;color:#c62828;"
            f"animation:hvd-magic-stale 0s linear {STALE_AFTER}s forwards'> · no word from "
            f"its kernel for {STALE_AFTER} s: if it restarted, the run ended with it (its logs: "
            f"{_e(os.path.relpath(run.run_dir))}/; loading hvd_magic again says how far it "
            f"got)</span>")


class Snapshot:
    """The output under a live dashboard that keeps its state as HTML (see the module's text)."""

    def __init__(self, view, run):
        from IPython import get_ipython
        from IPython.display import display

        self.view = view
        self._sent = None
        self._due = 0.0
        self.every = SNAPSHOT_EVERY
        self.handle = None  # (no kernel, no page: a widget drawn elsewhere has nothing to keep)
        if getattr(get_ipython(), "kernel", None) is not None:
            self.handle = display(self._bundle(run), raw=True, display_id=True)

    def refresh(self, run):
        """Sent again when due and changed (at most a twentieth of the time goes to it)."""
        now = time.monotonic()
        if self.handle is None or now < self._due:
            return
        began = time.perf_counter()
        bundle = self._bundle(run)
        if bundle["text/html"] != self._sent:
            self._sent = bundle["text/html"]
            self.handle.update(bundle, raw=True)
        self.every = max(SNAPSHOT_EVERY, 20 * (time.perf_counter() - began))
        self._due = now + self.every

    def clear(self):
        """The run ended: its rendition took the widget's place, the snapshot goes."""
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)
            self.handle = None

    def _bundle(self, run):
        view = self.view
        seen = time.strftime("%H:%M:%S")
        header = view._header_html(run, seen=seen)
        markup = (f"<div class='hvd-magic-snapshot' data-run='{_e(run.id)}'>"
                  f"<div>{header}</div>"
                  f"<div style='color:#c62828'>This is the run as its kernel last saw it, at "
                  f"{seen}: the kernel went before the run ended, and the run with it. Loading "
                  f"hvd_magic in this notebook again says how far it got.</div>"
                  f"{notices_html(view._notices)}{view._table_html(run)}"
                  f"{_logs_html(view, run, SNAPSHOT_LOG_LINES)}{footer_html(run)}</div>")
        text = (f"hvd_magic run {run.id}: {run.state} when its kernel last saw it ({seen}); "
                f"logs: {os.path.relpath(run.run_dir)}")
        return {"text/html": markup, "text/plain": text}


def clock_html(run, began, ended_at):
    """The cell's time so far, in whole seconds (so it never goes back); at the end, its wall
    time, and the ranks' own time beside it when that is much less."""
    if ended_at is None:
        return f"<span data-elapsed>{int(time.monotonic() - began)} s</span>"
    wall = ended_at - began
    ranks = (run.ended - run.started) if run.started and run.ended else None
    beside = f" (ranks {ranks:.1f} s)" if ranks is not None and wall - ranks >= 1.0 else ""
    return f"<span data-elapsed>{wall:.1f} s</span>{beside}"


def notices_html(notices):
    """The run's notices: a stall or a lost rank in red; a launcher's note (more ranks than
    cores) in orange; an elastic run's new ring or replacement is news, not harm."""
    return "".join(f"<div style='color:{_NOTICE_COLOURS.get(t, '#c62828')};"
                   f"white-space:pre-wrap' data-notice='{_e(t)}'>{_e(n)}</div>"
                   for n, t in notices)


def timeline_note(run):
    try:
        from ..timelines.show import timeline_note as note
        return note(run)
    except Exception:  # (not there yet, or the file went away) the path is enough
        return f"timeline: {os.path.relpath(run.timeline_path)}\n"


def timeline_html(run):
    if not getattr(run, "timeline_path", None):
        return ""
    try:
        from ..timelines.show import timeline_html as drawn
        return drawn(run)
    except Exception as exc:  # a broken timeline must not hide the run's result
        return f"<div>Timeline: {link_html(run.timeline_path)} (not drawn: {_e(str(exc))})</div>"


def _e(text):
    return html.escape(str(text), quote=True)
