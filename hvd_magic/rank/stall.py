"""Rank side of the hang watchdog: tell the driver when this rank waits long in a collective.

Horovod's stall inspector never fires with the Gloo controller, so a rank waiting for peers that
will never join (they finished their loop early, or are busy elsewhere) waits forever. Each wait
in `synchronize`, `join` or `barrier` sets a flag (a time check, no syscall); a monitor thread
sends a ``blocked`` event once a wait has lasted `REPORT_AFTER` seconds and ``unblocked`` when it
ends. The driver (`hvd_magic.driver.watchdog`) compares the ranks.
"""

import functools
import threading
import time

from . import hooks, reporting

REPORT_AFTER = 2.0

_waiting = {"since": None, "op": None, "reported": False}
_lock = threading.Lock()


def _blocking(fn, op):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _lock:
            _waiting.update(since=time.monotonic(), op=op, reported=False)
        try:
            return fn(*args, **kwargs)
        finally:
            with _lock:
                reported = _waiting["reported"]
                _waiting.update(since=None, op=None, reported=False)
            if reported:
                reporting.send({"t": "unblocked"})
    return wrapper


def _monitor():
    while True:
        time.sleep(0.5)
        with _lock:
            since, op = _waiting["since"], _waiting["op"]
            due = since is not None and not _waiting["reported"] \
                and time.monotonic() - since >= REPORT_AFTER
            if due:
                _waiting["reported"] = True
        if due:
            reporting.send({"t": "blocked", "op": op, "seconds": time.monotonic() - since})


def _patch(mpi_ops):
    for op in ("synchronize", "join", "barrier"):
        fn = getattr(mpi_ops, op, None)
        if fn is not None:
            setattr(mpi_ops, op, _blocking(fn, op))
    threading.Thread(target=_monitor, name="hvd-magic-stall", daemon=True).start()


def install():
    hooks.when_imported("horovod.torch.mpi_ops", _patch)
