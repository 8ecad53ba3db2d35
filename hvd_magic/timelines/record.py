"""``with hvd_magic.timeline():`` on a rank: record a Horovod timeline of just one block.

Runs in the rank process (Horovod's ``DYNAMIC`` mode, set by the task); imports nothing of the
notebook side.
"""

import contextlib
import os
import sys

from .trace import _tensor_name, _write_events, repair


@contextlib.contextmanager
def timeline(mark_cycles=False):
    """Record a Horovod timeline of just this block, inside a %%horovod cell.

    Call it on every rank (the cell runs everywhere): only rank 0 writes, the other ranks just
    take note of `mark_cycles`. The window comes back like a ``--timeline`` run's file
    (``%horovod_timeline`` shows it); several windows in one run are kept one after the other.
    Under ``--timeline`` the whole run is recorded already and this does nothing.

    Examples
    --------
    >>> for step in range(50):
    ...     if step == 10:
    ...         with hvd_magic.timeline():
    ...             train_step()
    ...     else:
    ...         train_step()
    """
    path = os.environ.get("HVD_MAGIC_TIMELINE_PATH")
    if not path:
        raise RuntimeError("hvd_magic.timeline() records on ranks started by %%horovod or "
                           "hvd_magic.run(); outside them, use horovod's own hvd.start_timeline().")
    import horovod.torch as hvd

    if not os.environ.get("HOROVOD_TIMELINE"):
        # Horovod was started without a timeline: hvd_magic saw no `timeline` in the job
        # (driver/run.py may_record_window), e.g. this is called from an installed package.
        if not hvd.is_initialized() or hvd.rank() == 0:
            sys.stderr.write(
                "hvd_magic.timeline(): no timeline is recorded: these ranks started Horovod "
                "without one (hvd_magic turns it on for a cell or function that names "
                "`timeline`; a warm session's ranks start without it). Run with "
                "env={'HOROVOD_TIMELINE': 'DYNAMIC'} (%%horovod --env HOROVOD_TIMELINE=DYNAMIC, "
                "or %horovod_session start --env HOROVOD_TIMELINE=DYNAMIC), or --timeline for "
                "the whole run.\n")
        yield None
        return
    if os.environ.get("HOROVOD_TIMELINE") != "DYNAMIC":
        yield path  # --timeline (or the user's own HOROVOD_TIMELINE) records everything already
        return
    # Horovod truncates the file it starts, so a second window goes to its own file, appended below.
    first = not os.path.exists(path)
    window = path if first else path + ".window"
    # start/stop_timeline are local calls, not collectives: on rank 0 they open/close the file
    # (blocking until the writer thread has), elsewhere they only record `mark_cycles`.
    hvd.start_timeline(window, mark_cycles=mark_cycles)
    try:
        yield path
    finally:
        hvd.stop_timeline()
        if not first and hvd.rank() == 0 and os.path.exists(window):
            _append_window(path, window)


def _append_window(path, window):
    """Add a later window's events to the timeline at `path`.

    Both share one clock (Horovod's timeline start), but Horovod numbers tensors ("pid") anew in
    every file, so the window's numbers are mapped onto the first file's by tensor name.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        events = repair(f.read())
    with open(window, encoding="utf-8", errors="replace") as f:
        extra = repair(f.read())
    pids = {e["args"]["name"]: e["pid"] for e in events if _tensor_name(e) is not None}
    remap = {}
    for e in extra:
        name = _tensor_name(e)
        if name is None:
            continue
        if name not in pids:
            pids[name] = max(list(pids.values()) + [0]) + 1
            events.append({"name": "process_name", "ph": "M", "pid": pids[name],
                           "args": {"name": name}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pids[name],
                           "args": {"sort_index": pids[name]}})
        remap[e["pid"]] = pids[name]
    for e in extra:
        if e.get("ph") != "M":
            events.append(dict(e, pid=remap[e["pid"]]) if e.get("pid") in remap else e)
    _write_events(path, events)
    os.remove(window)
