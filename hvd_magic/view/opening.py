"""What a ``%%horovod`` cell shows at once: one line under the cell as soon as the magic starts,
before its imports, the pickling of its values or Spark's start (which can take seconds), so that
a person never looks at an empty cell wondering whether it runs.

The `Opening` also fixes when the cell began: the dashboard's clock counts from there. The
dashboard writes its header line into it while it waits to be shown, then takes its place (the
same output, updated); a run that ends before that leaves its header and links there, and its
lines follow as text; a run that never started empties it (its error says why).

Not for: terminals and scripts (no kernel: nothing is shown, `began` still counts), or runs that
show nothing (``--quiet``, ``--text``).
"""

import html
import os
import re
import time

from ..words import plural

FIRST_WORDS = "<b>hvd_magic</b> · {ranks} · <span data-phase>starting…</span>"


class Opening:
    """The cell's first output (a display handle), or nothing where there is no kernel."""

    def __init__(self, handle=None):
        self.began = time.monotonic()
        self.handle = handle
        self._shown = None

    def began_at(self):
        """When the cell began, as a unix time (where the charts' time starts)."""
        return time.time() - (time.monotonic() - self.began)

    @classmethod
    def show(cls, np):
        """Show the first line under the running cell, in a kernel that draws widgets."""
        opening = cls()
        if os.environ.get("HVD_MAGIC_NO_WIDGETS"):
            return opening
        from IPython import get_ipython  # (already imported: we run inside IPython)
        if getattr(get_ipython(), "kernel", None) is None:
            return opening
        from IPython.display import display
        opening._shown = FIRST_WORDS.format(ranks=plural(abs(np), "rank"))
        opening.handle = display(_bundle(opening._shown), raw=True, display_id=True)
        return opening

    def update(self, html):
        """Put `html` in the line (one message, only when it changed)."""
        if self.handle is not None and html != self._shown:
            self._shown = html
            self.handle.update(_bundle(html), raw=True)

    def replace_with(self, bundle):
        """The dashboard (its display's mime bundle) takes the line's place: the display's
        handle, which is the dashboard's now (it replaces itself with its static rendition at
        the end); None where there is no line to replace."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.update(bundle, raw=True)
        return handle

    def settle(self, html):
        """The line's last words (a run that ended before its dashboard showed: its header and
        links): put in its place, or shown now where there was no line (a run started from
        Python)."""
        if self.handle is None:
            from IPython.display import display
            display(_bundle(html), raw=True)
        else:
            self.update(html)
            self.handle = None

    def clear(self):
        """Leave nothing visible (a run that ends before its dashboard shows prints text; a
        cell that fails before its run starts shows its error). Idempotent."""
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)
            self.handle = None


def _bundle(markup):
    """The line as HTML, and as plain text for front ends (and saved notebooks) without HTML."""
    return {"text/html": markup, "text/plain": html.unescape(re.sub(r"<[^>]+>", "", markup))}
