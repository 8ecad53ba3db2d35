"""Every run of this process, newest last: what `hvd_magic.runs()` and `last_run()` read."""

import threading

_runs = []
_lock = threading.Lock()


def add(run):
    with _lock:
        _runs.append(run)


def runs():
    """Every run started in this process, oldest first."""
    with _lock:
        return list(_runs)


def last_run():
    """The latest run (finished or not), or None."""
    with _lock:
        return _runs[-1] if _runs else None
