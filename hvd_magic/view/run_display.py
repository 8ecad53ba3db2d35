"""``display(run)``, and a `Run` left as a cell's value: the run's dashboard, wherever it is asked
for. A run started from Python (``hvd_magic.run(fn, np=2, background=True)``) has no view of its
own; displayed while it runs, it gets a live dashboard (added beside whatever view it has: the
driver loop feeds both), its lines so far read back from its run folder; displayed after its end,
the dashboard's static rendition. A run whose dashboard this very cell shows already (a
``%%horovod --background`` cell's value), or shown as text by choice (``--text``), is said in one
line instead, as it is where there are no widgets (`hvd_magic.driver.shown`: a line put right when the run ends, never a stale "running").

Registered for `Run` by ``%load_ext`` (IPython's display formatter), so the driver knows nothing
of views. Not for: the dashboard itself (`hvd_magic.view.dashboard`).
"""

import collections
import threading
import time

RAW_TAIL_BYTES = 64 * 1024  # of each rank's log read back for a dashboard shown late


def show_run(run):
    """IPython's printer for a `Run`: its dashboard, or its one line (see the module's text)."""
    from . import widgets_available
    from .dashboard import shown_here

    if not widgets_available() or shown_here(run) or _text_by_choice(run):
        run._ipython_display_()
        return
    view = _late_dashboard(run)
    if run._done.is_set():
        from IPython.display import display
        from .rendition import final_html
        view._ended_at = view.opening.began + (run.ended or time.time()) - _began(run)
        display(final_html(view, run), raw=True)
        return
    view._show(run)
    _Attached.add(run, view)


def _text_by_choice(run):
    """Whether the run is shown as text by its caller's choice (``--text``, ``--quiet``, a view
    passed to `hvd_magic.run`): then its one line, not a dashboard."""
    from .dashboard import Dashboard
    view = run.view
    while view is not None and not isinstance(view, (Dashboard, _Attached)) and \
            hasattr(view, "view"):  # (the wrappers: MLflow's tracker, the timeline's note)
        view = view.view
    return view is not None and not isinstance(view, (Dashboard, _Attached))


def _began(run):
    return run.preparing_since or run.started or time.time()


def _late_dashboard(run):
    """A dashboard for a run under way or ended: its clock from the run's own start, each rank's
    lines so far from the run folder."""
    from .dashboard import TAIL_LINES, Dashboard
    from .opening import Opening

    opening = Opening()
    opening.began = time.monotonic() - (time.time() - _began(run))
    view = Dashboard(opening=opening)
    view._tails = [collections.deque(_tail(run, rank), maxlen=TAIL_LINES)
                   for rank in range(run.np)]
    return view


def _tail(run, rank):
    try:
        with open(run.log_path(rank), "rb") as f:
            start = max(0, f.seek(0, 2) - RAW_TAIL_BYTES)
            f.seek(start)
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:  # no folder yet (still preparing): nothing printed yet either
        return []
    return [("stdout", line) for line in lines[1 if start else 0:]]  # (not a cut first line)


class _Attached:
    """A view added to a running run beside its own: every call goes to both, and the late one
    is finished exactly once (by the loop, or here if the run ended as it was added)."""

    def __init__(self, first, late):
        self.first, self.late = first, late
        self._finished = threading.Lock()
        self._done = False

    @classmethod
    def add(cls, run, late):
        both = cls(run.view, late)
        run.view = both  # (one assignment: the loop's next call reaches both)
        if run._done.is_set():  # it ended meanwhile: the loop may have finished the old view
            both._finish_late(run)

    def start(self, run):
        self._each("start", run)

    def event(self, run, rank, event):
        self._each("event", run, rank, event)

    def tick(self, run):
        self._each("tick", run)

    def finish(self, run):
        if self.first is not None:
            self.first.finish(run)
        self._finish_late(run)

    def _finish_late(self, run):
        with self._finished:
            if self._done:
                return
            self._done = True
        self.late.finish(run)

    def _each(self, name, *args):
        for view in (self.first, self.late):
            if view is not None:
                getattr(view, name)(*args)
