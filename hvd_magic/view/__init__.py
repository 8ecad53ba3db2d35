"""How a run is shown: a text view (terminals, scripts) and, in a kernel with widgets, a dashboard.

Both are fed the same calls by the driver loop: `start(run)`, `event(run, rank, event)` for each
event, `tick(run)` a few times a second, `finish(run)`. Views read the `Run` and its `RankState`s;
they never talk to Spark or to the tasks, and nothing outside the notebook side imports them.

- `text`: `TextView`;
- `dashboard`: `Dashboard` (ipywidgets), which shows itself only for runs longer than a moment;
- `opening`: the line a cell shows at once, which the dashboard replaces.
"""

import os

from ..lines import visible_text
from .opening import Opening
from .text import TextView, summary_text

__all__ = ["Opening", "TextView", "make_view", "summary_text", "visible_text",
           "widgets_available"]


def widgets_available():
    """True inside a kernel whose front end can show ipywidgets (and not switched off)."""
    if os.environ.get("HVD_MAGIC_NO_WIDGETS"):
        return False
    try:
        from IPython import get_ipython
        ip = get_ipython()
        if ip is None or not hasattr(ip, "kernel"):
            return False
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def make_view(quiet=False, widgets=None, verbose=False, opening=None):
    """The view for a run: the dashboard where widgets work, else text; `quiet` shows nothing;
    `verbose` shows C++ libraries' start-up chatter too; `opening`, the cell's first line
    (`Opening.show`), becomes the dashboard (a text view empties it)."""
    if not quiet:
        if widgets is None:
            widgets = widgets_available()
        if widgets:
            from .dashboard import Dashboard  # imports ipywidgets, so only here
            return Dashboard(verbose=verbose, opening=opening)
    if opening is not None:
        opening.clear()
    return TextView(quiet=quiet, verbose=verbose)
