"""A run shown as a cell's value (a background cell's: the `Run`, while it runs), put right when
the run ends: a display's update reaches JupyterLab (and nbclient) whenever it comes, so a
notebook saved later keeps the state the run ended in, never a stale "running".

Not for: the dashboard (`hvd_magic.view.dashboard`, which replaces its own display the same way).
"""


class ShownValue:
    """Mixed into `hvd_magic.driver.run.Run`: `_ipython_display_`, and `show_end` for the loop."""

    def _ipython_display_(self):
        from IPython import get_ipython
        from IPython.display import display

        live = getattr(get_ipython(), "kernel", None) is not None  # (a terminal prints updates)
        handle = display({"text/plain": repr(self)}, raw=True, display_id=live or None)
        if live:
            self.__dict__.setdefault("_shown", []).append(handle)
            if self._done.is_set():  # it ended meanwhile: its end may have passed the list by
                self.show_end()

    def show_end(self):
        """Every display of this run as a value, put right now that it has ended."""
        shown = self.__dict__.get("_shown", [])
        while shown:
            try:
                shown.pop().update({"text/plain": repr(self)}, raw=True)
            except Exception:  # noqa: BLE001  (a display gone: nothing of the run's depends on it)
                pass
