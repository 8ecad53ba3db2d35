"""A Horovod timeline as data: repair what came back, read it as spans per tensor.

Rank 0 alone writes Horovod's Chrome-trace timeline, to its own local disk. Its task sends the file
back to the driver when the rank process ends (also after a failure or a cancel), into the run
folder; `finalize` turns what arrived, possibly cut off mid-event, into valid JSON
``run_dir/timeline.json``. `Trace` reads it as spans per tensor for `summary` and `picture`.
"""

import json
import math
import os
from typing import NamedTuple, Optional


FILE_NAME = "timeline.json"
HOW_TO_RECORD = ("Record one with `%%horovod --timeline` (the whole run) or with "
                 "`with hvd_magic.timeline():` around a few steps inside the cell.")
# Above this size the picture is not drawn (parsing would take the kernel tens of seconds).
PICTURE_MAX_BYTES = 200 * 1024 * 1024
DTYPE_BYTES = {"uint8": 1, "int8": 1, "bool": 1, "uint16": 2, "int16": 2, "float16": 2,
               "bfloat16": 2, "int32": 4, "float32": 4, "int64": 8, "float64": 8}


# --- repairing what came back ----------------------------------------------------------------

def _parse(text):
    """(events, complete): the events of a Horovod timeline, and whether the text was valid JSON.

    Horovod rewrites the closing ``]`` after every event, but a rank that is killed leaves
    whatever its stream buffer held unwritten, so the file can end in the middle of an event.
    """
    text = text.strip()
    if not text:
        return [], False
    try:
        data = json.loads(text)
        events = data if isinstance(data, list) else data.get("traceEvents", [])
        return [e for e in events if isinstance(e, dict)], True
    except ValueError:
        pass
    events = []
    body = text[1:] if text.startswith("[") else text
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
            # Horovod does not escape tensor names; skip one bad event rather than lose the rest.
            # At the cut-off tail there is no next event, and we stop.
            i = body.find(",{", i + 1)
            if i < 0:
                break
            continue
        if isinstance(obj, dict):
            events.append(obj)
    return events, False


def repair(text):
    """Valid Chrome-trace events (a list of dicts) from a possibly cut-off Horovod timeline."""
    return _parse(text)[0]


def _write_events(path, events):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(events, f, separators=(",", ":"))
    os.replace(tmp, path)


def finalize(run_dir):
    """Turn the received ``timeline.json.part`` into a valid ``timeline.json``; return its path."""
    partial = os.path.join(run_dir, FILE_NAME + ".part")
    path = os.path.join(run_dir, FILE_NAME)
    if not os.path.exists(partial):
        return path if os.path.exists(path) else None
    with open(partial, encoding="utf-8", errors="replace") as f:
        events, complete = _parse(f.read())
    if complete:
        os.replace(partial, path)  # already valid: no need to rewrite a file of many megabytes
    else:
        _write_events(path, events)
        os.remove(partial)
    return path


# --- recording a window from inside a cell ---------------------------------------------------



def _tensor_name(event):
    """The tensor a "process_name" metadata event names, or None (pid 0 is the timeline itself)."""
    if event.get("ph") == "M" and event.get("name") == "process_name":
        name = (event.get("args") or {}).get("name")
        return name if isinstance(name, str) else None
    return None





# --- reading a timeline ----------------------------------------------------------------------

class Span(NamedTuple):
    tensor: str
    name: str                 # Horovod's phase: NEGOTIATE_ALLREDUCE, ALLREDUCE, QUEUE, ...
    start: float              # microseconds since the timeline started
    end: float
    depth: int                # 0: negotiation or the operation itself; 1: an activity inside it
    parent: Optional[str]     # the enclosing span's name
    nbytes: Optional[int]     # of the tensor, for an operation that ended normally
    cut: bool = False         # still open when the timeline ended (cancel, failure, window end)


class Negotiation(NamedTuple):
    """One tensor's negotiation, as rank 0's coordinator saw it: each rank's readiness (Horovod's
    ticks under a NEGOTIATE_ bar, named by the rank), in the order they came."""
    tensor: str
    name: str                 # NEGOTIATE_ALLREDUCE, ...
    ready: list               # [(rank, µs)], first ready first


class Trace:
    """Rank 0's timeline as spans per tensor: what `summarize` and `svg` read; and its
    negotiations (`Negotiation`), which say which rank the others waited on."""

    def __init__(self, events):
        self.events = len(events)
        names = {e["pid"]: _tensor_name(e) for e in events if _tensor_name(e) is not None}
        self.tensors = []          # in order of first appearance
        self.spans = []
        self.negotiations = []
        ticks = {}                 # pid -> [(rank, ts)] of its open negotiation
        seen = set()
        times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
        self.start = min(times) if times else 0
        self.end = max(times) if times else 0
        open_spans = {}            # pid -> stack of (name, start)
        for e in events:
            phase, pid, ts = e.get("ph"), e.get("pid"), e.get("ts")
            if phase == "X" and pid in ticks and str(e.get("name", "")).isdigit() and \
                    isinstance(ts, (int, float)):  # a rank ready, inside a negotiation
                ticks[pid].append((int(e["name"]), ts))
            if phase not in ("B", "E") or pid not in names or not isinstance(ts, (int, float)):
                continue  # metadata, cycle markers, ranks-ready ticks ("X")
            stack = open_spans.setdefault(pid, [])
            if phase == "B" and not stack and str(e.get("name", "")).startswith("NEGOTIATE_"):
                ticks[pid] = []
            elif phase == "E" and len(stack) == 1 and pid in ticks:
                self.negotiations.append(Negotiation(names[pid], stack[0][0], ticks.pop(pid)))
            if phase == "B" and pid not in seen:
                seen.add(pid)
                self.tensors.append(names[pid])
            if phase == "B":
                stack.append((str(e.get("name", "?")), ts))
            elif stack:  # an "E" with no "B" began before a window opened: nothing to draw
                name, start = stack.pop()
                self.spans.append(Span(names[pid], name, start, ts, len(stack),
                                       stack[-1][0] if stack else None, _nbytes(e.get("args"))))
        for pid, stack in open_spans.items():
            for depth, (name, start) in enumerate(stack):
                self.spans.append(Span(names[pid], name, start, self.end, depth,
                                       stack[depth - 1][0] if depth else None, None, cut=True))

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8", errors="replace") as f:
            return cls(repair(f.read()))

    @property
    def wall(self):
        """Microseconds from the first event to the last."""
        return self.end - self.start


def _nbytes(args):
    """Bytes of a tensor from the dtype and shape Horovod writes when an operation ends."""
    if not isinstance(args, dict) or args.get("dtype") not in DTYPE_BYTES:
        return None
    try:
        dims = [int(d) for d in str(args.get("shape", "")).strip("[]").split(",") if d.strip()]
    except ValueError:
        return None
    return DTYPE_BYTES[args["dtype"]] * math.prod(dims)


def exclusive_shares(spans):
    """{key: µs} from [(key, start, end)]: each moment's time split evenly among the keys then
    active (a key's own overlapping spans count once), so the values add up to the time any
    key was active: shares of one whole, never past 100% (fused tensors overlap)."""
    edges = sorted([(start, 1, key) for key, start, end in spans if end > start]
                   + [(end, -1, key) for key, start, end in spans if end > start],
                   key=lambda edge: (edge[0], edge[1]))
    active, shares, last = {}, {}, None
    for t, change, key in edges:
        if active and last is not None and t > last:
            each = (t - last) / len(active)
            for k in active:
                shares[k] = shares.get(k, 0.0) + each
        last = t
        active[key] = active.get(key, 0) + change
        if not active[key]:
            del active[key]
    return shares


def _union(intervals):
    """The length of the union of (start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _is_operation(span):
    return span.depth == 0 and not span.name.startswith("NEGOTIATE_")
