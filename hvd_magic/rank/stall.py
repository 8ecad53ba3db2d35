"""Rank side of the hang watchdog: tell the driver when this rank waits long for its peers.

Horovod's stall inspector never fires with the Gloo controller, so a rank waiting for peers that
will never join (they finished their loop early, or are busy elsewhere) waits forever; and a rank
in ``hvd.init()`` waits for every peer to call it too, up to several times Gloo's timeout. Each
wait in `init`, `synchronize`, `join` or `barrier` sets a flag (a time check, no syscall); a
monitor thread sends a ``blocked`` event (with the operation) once a wait has lasted
`REPORT_AFTER` seconds and ``unblocked`` when it ends. The driver (`hvd_magic.driver.watchdog`)
compares the ranks.

While a peer of a warm session is held in pdb (`hvd_magic.rank.debugger`), a collective waits
before it starts (its enqueue, ``join``, ``barrier``): on our channel, not inside Horovod.
"""

import functools
import threading
import time

from . import debugger, hooks, reporting

REPORT_AFTER = 2.0

_waiting = {"since": None, "op": None, "reported": False}
_lock = threading.Lock()


def _blocking(fn, op):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if op in ("join", "barrier"):
            debugger.wait_while_held()
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


def _held_first(fn):
    """A collective's enqueue (``allreduce_async``...): not while a peer is held in pdb."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debugger.wait_while_held()
        return fn(*args, **kwargs)
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


_monitor_started = threading.Event()


def _patch(mpi_ops):
    # Patched in the module the framework's package imports them from, before it does.
    for op in ("init", "synchronize", "join", "barrier"):
        fn = getattr(mpi_ops, op, None)
        if fn is not None:
            setattr(mpi_ops, op, _blocking(fn, op))
    for name in [n for n in vars(mpi_ops) if n.endswith(("_async", "_async_"))]:
        if callable(getattr(mpi_ops, name)):
            setattr(mpi_ops, name, _held_first(getattr(mpi_ops, name)))
    if not _monitor_started.is_set():
        _monitor_started.set()
        threading.Thread(target=_monitor, name="hvd-magic-stall", daemon=True).start()


def install():
    for framework in ("torch", "tensorflow"):
        hooks.when_imported(f"horovod.{framework}.mpi_ops", _patch)
