"""Horovod timelines brought back to the notebook.

Rank 0 writes Horovod's Chrome-trace timeline to its local disk; its task sends the file back to
the driver as it ends (also after a failure or a cancel), into the run folder. `finalize` repairs
a cut-off file into valid JSON. `timeline()` records a bounded window from inside a cell.
"""

import contextlib
import json
import os


def repair(text):
    """Valid Chrome-trace JSON (a list of events) from a possibly cut-off Horovod timeline."""
    text = text.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else data.get("traceEvents", [])
    except ValueError:
        pass
    events = []
    body = text.lstrip("[")
    decoder = json.JSONDecoder()
    i = 0
    while i < len(body):
        while i < len(body) and body[i] in " \t\r\n,":
            i += 1
        if i >= len(body) or body[i] == "]":
            break
        try:
            obj, i = decoder.raw_decode(body, i)
        except ValueError:
            break  # the cut-off tail
        if isinstance(obj, dict):
            events.append(obj)
    return events


def finalize(run_dir):
    """Turn the received ``timeline.json.part`` into a valid ``timeline.json``; return its path."""
    partial = os.path.join(run_dir, "timeline.json.part")
    path = os.path.join(run_dir, "timeline.json")
    if not os.path.exists(partial):
        return path if os.path.exists(path) else None
    with open(partial, encoding="utf-8", errors="replace") as f:
        events = repair(f.read())
    with open(path, "w") as f:
        json.dump(events, f)
    os.remove(partial)
    return path


@contextlib.contextmanager
def timeline(mark_cycles=False):
    """Record a Horovod timeline of just this block, inside a %%horovod cell.

    Examples
    --------
    >>> for step in range(50):
    ...     if step == 10:
    ...         with hvd_magic.timeline():
    ...             train_step()
    ...     else:
    ...         train_step()
    """
    import horovod.torch as hvd

    path = os.environ.get("HVD_MAGIC_TIMELINE_PATH")
    if not path:
        raise RuntimeError("hvd_magic.timeline() records on ranks started by %%horovod.")
    hvd.start_timeline(path, mark_cycles=mark_cycles)
    try:
        yield path
    finally:
        hvd.stop_timeline()
