"""Horovod timelines brought back to the notebook: record, repair, summarise, draw.

Rank 0 alone writes Horovod's Chrome-trace timeline, to its own local disk. Its task sends the file
back to the driver when the rank process ends (also after a failure or a cancel), into the run
folder; `finalize` turns what arrived, possibly cut off mid-event, into valid JSON
``run_dir/timeline.json``. ``%%horovod --timeline`` records the whole run; ``with
hvd_magic.timeline():`` inside a cell records only that block (Horovod's ``DYNAMIC`` mode).

Then `summarize` (tables of tensors and operations), `svg` (one lane per tensor, Horovod's phases
as coloured spans), `timeline_html` (a link to the file, how to open it in Perfetto, the picture:
what the dashboard shows at the end of a run) and `timeline_magic` (``%horovod_timeline``).

Not for: exploring a trace in depth. Perfetto and ``chrome://tracing`` do that far better; this
module gives the glance that tells you whether it is worth opening them.
"""

import contextlib
import glob
import html
import json
import math
import os
import sys
import time
import types
import urllib.parse
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


def _tensor_name(event):
    """The tensor a "process_name" metadata event names, or None (pid 0 is the timeline itself)."""
    if event.get("ph") == "M" and event.get("name") == "process_name":
        name = (event.get("args") or {}).get("name")
        return name if isinstance(name, str) else None
    return None


class _CallableModule(types.ModuleType):
    # Importing this submodule makes `hvd_magic.timeline` the module rather than the function
    # that `hvd_magic.__getattr__` hands out; so that `with hvd_magic.timeline():` works either
    # way, calling the module records a window too.
    def __call__(self, mark_cycles=False):
        return timeline(mark_cycles=mark_cycles)


sys.modules[__name__].__class__ = _CallableModule


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


class Trace:
    """Rank 0's timeline as spans per tensor: what `summarize` and `svg` read."""

    def __init__(self, events):
        self.events = len(events)
        names = {e["pid"]: _tensor_name(e) for e in events if _tensor_name(e) is not None}
        self.tensors = []          # in order of first appearance
        self.spans = []
        seen = set()
        times = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
        self.start = min(times) if times else 0
        self.end = max(times) if times else 0
        open_spans = {}            # pid -> stack of (name, start)
        for e in events:
            phase, pid, ts = e.get("ph"), e.get("pid"), e.get("ts")
            if phase not in ("B", "E") or pid not in names or not isinstance(ts, (int, float)):
                continue  # metadata, cycle markers, ranks-ready ticks ("X")
            stack = open_spans.setdefault(pid, [])
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


# --- tables ----------------------------------------------------------------------------------

def _ms(us):
    return f"{us / 1000:.3f}" if us < 10_000 else f"{us / 1000:.1f}"


def _size(nbytes):
    if nbytes is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024


class Table:
    """Rows with a text and an HTML rendering (what a notebook shows of a returned value)."""

    def __init__(self, title, columns, rows, note=""):
        self.title = title
        self.columns = columns
        self.rows = [[str(c) for c in row] for row in rows]
        self.note = note

    def __repr__(self):
        widths = [max([len(c)] + [len(r[i]) for r in self.rows])
                  for i, c in enumerate(self.columns)]

        def line(cells):  # names left, numbers right
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

        out = [self.title, line(self.columns)] + [line(r) for r in self.rows]
        return "\n".join(out + ([self.note] if self.note else []))

    def _repr_html_(self):
        def cell(tag, i, text):
            align = "left" if i == 0 else "right"
            return f'<{tag} style="text-align:{align}">{html.escape(text)}</{tag}>'

        head = "".join(cell("th", i, c) for i, c in enumerate(self.columns))
        body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(r)) + "</tr>"
                       for r in self.rows)
        note = f"<div><small>{html.escape(self.note)}</small></div>" if self.note else ""
        return (f"<div><b>{html.escape(self.title)}</b><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{note}</div>")


class Summary:
    """Where the time went on rank 0: per tensor and per operation (Horovod's phase names).

    `tensors` and `operations` hold every row as a dict, busiest first, times in microseconds:
    ``count`` (of operations for a tensor; of spans for a phase), ``total_us`` (summed over
    spans), ``mean_us`` (``total_us / count``: for a tensor its mean latency, negotiation
    included), ``bytes`` (per call for a tensor, in all for a phase; None when Horovod did not
    say), ``share`` (of the timeline's wall time during which the tensor, or any tensor for a
    phase, was in it: fused tensors overlap, so a phase's total can exceed the wall time).
    """

    def __init__(self, trace, path=None, top=10):
        self.path = path
        self.top = top
        self.wall_us = trace.wall
        self.events = trace.events
        tensors, operations, intervals = {}, {}, {}
        for s in trace.spans:
            if s.cut:
                continue  # its end is not known: it would make up a duration
            t = tensors.setdefault(s.tensor, {"tensor": s.tensor, "count": 0, "total_us": 0,
                                              "bytes": None})
            o = operations.setdefault(s.name, {"operation": s.name, "count": 0, "total_us": 0,
                                               "bytes": None})
            duration = s.end - s.start
            o["count"] += 1
            o["total_us"] += duration
            intervals.setdefault(("operation", s.name), []).append((s.start, s.end))
            if s.depth == 0:
                t["total_us"] += duration
                intervals.setdefault(("tensor", s.tensor), []).append((s.start, s.end))
            if _is_operation(s):
                t["count"] += 1
                if s.nbytes is not None:
                    t["bytes"] = s.nbytes
                    o["bytes"] = (o["bytes"] or 0) + s.nbytes
        for kind, rows in (("tensor", tensors), ("operation", operations)):
            for name, row in rows.items():
                row["mean_us"] = row["total_us"] / row["count"] if row["count"] else None
                busy = _union(intervals.get((kind, name), []))
                row["share"] = busy / self.wall_us if self.wall_us else 0.0
        by_total = lambda row: -row["total_us"]  # noqa: E731
        self.tensors = sorted(tensors.values(), key=by_total)
        self.operations = sorted(operations.values(), key=by_total)

    def tables(self):
        def rows(items, key):
            return [[r[key], r["count"], _ms(r["total_us"]),
                     "" if r["mean_us"] is None else _ms(r["mean_us"]),
                     _size(r["bytes"]), f"{100 * r['share']:.1f}%"] for r in items[:self.top]]

        def more(items, what):
            hidden = len(items) - self.top
            return f"… and {hidden} more {what}" if hidden > 0 else ""

        return [
            Table("Top tensors", ["tensor", "operations", "total ms", "mean latency ms",
                                  "bytes/call", "share of wall"],
                  rows(self.tensors, "tensor"), more(self.tensors, "tensors")),
            Table("Top operations", ["operation", "count", "total ms", "mean ms", "bytes",
                                     "share of wall"],
                  rows(self.operations, "operation"), more(self.operations, "operations")),
        ]

    def _headline(self):
        where = f" ({self.path})" if self.path else ""
        return (f"Horovod timeline of rank 0{where}: {self.events} events over "
                f"{_ms(self.wall_us)} ms of wall time.")

    def __repr__(self):
        return "\n\n".join([self._headline()] + [repr(t) for t in self.tables()])

    def _repr_html_(self):
        return (f"<div>{html.escape(self._headline())}</div>"
                + "".join(t._repr_html_() for t in self.tables()))


def summarize(path, top=10):
    """The `Summary` of the timeline file at `path`."""
    return Summary(Trace.load(path), path=path, top=top)


# --- the picture -----------------------------------------------------------------------------

# Top-level operations get light colours: their own time is what their activities leave over.
_EXACT_COLOURS = {"ALLREDUCE": "#ff9d9a", "ALLGATHER": "#d4a6c8", "BROADCAST": "#a0cbe8",
                  "ALLTOALL": "#b6992d", "REDUCESCATTER": "#f1ce63", "ADASUM": "#ff9d9a"}
_PART_COLOURS = [("NEGOTIATE", "#bab0ac"), ("QUEUE", "#edc948"), ("WAIT_FOR", "#f28e2b"),
                 ("INIT_", "#9c755f"), ("ALLOCATE", "#9c755f"), ("MEMCPY_IN", "#4e79a7"),
                 ("MEMCPY_OUT", "#76b7b2"), ("ALLREDUCE", "#e15759"), ("ALLGATHER", "#b07aa1"),
                 ("BCAST", "#59a14f"), ("ALLTOALL", "#8cd17d"), ("REDUCESCATTER", "#d37295")]
_OTHER_COLOURS = ["#499894", "#86bcb6", "#fabfd2", "#d7b5a6", "#79706e", "#8cd17d"]


def colour(phase):
    if phase in _EXACT_COLOURS:
        return _EXACT_COLOURS[phase]
    for part, c in _PART_COLOURS:
        if part in phase:
            return c
    return _OTHER_COLOURS[sum(map(ord, phase)) % len(_OTHER_COLOURS)]


def _tick_step(span):
    """A round step (1, 2 or 5 times a power of ten) giving about six ticks over `span`."""
    raw = max(span / 6, 1e-9)
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _coverage(spans, start, bin_us, nbins):
    """phase -> time (µs) spent in that phase and in none nested inside it, per time bin."""
    cover = {}

    def add(phase, s, e, sign):
        bins = cover.setdefault(phase, [0.0] * nbins)
        b0 = min(nbins - 1, int((s - start) / bin_us))
        b1 = min(nbins - 1, int((e - start) / bin_us))
        if b0 == b1:
            bins[b0] += sign * (e - s)
            return
        bins[b0] += sign * (start + (b0 + 1) * bin_us - s)
        for b in range(b0 + 1, b1):
            bins[b] += sign * bin_us
        bins[b1] += sign * (e - start - b1 * bin_us)

    for s in spans:
        if s.end > s.start:
            add(s.name, s.start, s.end, 1)
            if s.parent is not None:
                add(s.parent, s.start, s.end, -1)  # that time is the nested phase's
    return cover


# Layout of the picture, in pixels.
_LABEL_W, _LANE_H, _GAP, _TOP, _BIN = 200, 14, 4, 22, 2


def svg(trace, width=880, max_lanes=16):
    """An SVG picture of a `Trace`: a lane per tensor, each phase a coloured span over time.

    Time is cut into 2-pixel bins; each bin shows the phase that took most of it, as a bar as
    high as the share of the bin the tensor was busy, so the picture stays small and legible for
    any number of events. The busiest `max_lanes` - 1 tensors get their own lane, in the order
    Horovod first saw them; the rest share a last lane.
    """
    if not trace.spans:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="30">'
                '<text x="4" y="20" font-family="sans-serif" font-size="12">No operation was '
                'recorded in this timeline.</text></svg>')
    plot_w = width - _LABEL_W - 12
    nbins = plot_w // _BIN
    wall = max(trace.wall, 1)
    lanes = _lanes(trace, max_lanes)
    body, totals = [], {}
    for index, (label, spans) in enumerate(lanes):
        y = _TOP + index * (_LANE_H + _GAP)
        cover = _coverage(spans, trace.start, wall / nbins, nbins)
        for phase, bins in cover.items():
            totals[phase] = totals.get(phase, 0) + sum(b for b in bins if b > 0)
        body += _lane(label, spans, cover, y, plot_w, wall / nbins)
    lanes_h = len(lanes) * (_LANE_H + _GAP)
    legend, height = _legend(totals, _TOP + lanes_h + 8, width)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
            + "".join(_axis(wall, plot_w, lanes_h) + body + legend) + "</svg>")


def _lanes(trace, max_lanes):
    """[(label, spans)]: a lane per tensor, or the busiest ones and a lane for the rest."""
    by_tensor, busy = {}, {}
    for s in trace.spans:
        by_tensor.setdefault(s.tensor, []).append(s)
        if s.depth == 0:
            busy[s.tensor] = busy.get(s.tensor, 0) + (s.end - s.start)
    tensors = [t for t in trace.tensors if t in by_tensor]
    if len(tensors) <= max_lanes:
        return [(t, by_tensor[t]) for t in tensors]
    keep = set(sorted(tensors, key=lambda t: -busy.get(t, 0))[:max_lanes - 1])
    rest = [t for t in tensors if t not in keep]
    return ([(t, by_tensor[t]) for t in tensors if t in keep]
            + [(f"+ {len(rest)} other tensors", [s for t in rest for s in by_tensor[t]])])


def _lane(label, spans, cover, y, plot_w, bin_us):
    """SVG elements of one lane: its label (with a tooltip) and its bars."""
    ops = sum(1 for s in spans if _is_operation(s))
    busy = _ms(sum(s.end - s.start for s in spans if s.depth == 0))
    short = label if len(label) <= 30 else label[:14] + "…" + label[-15:]
    out = [f'<rect x="{_LABEL_W}" y="{y}" width="{plot_w}" height="{_LANE_H}" fill="#f4f4f4"/>',
           f'<text x="{_LABEL_W - 6}" y="{y + _LANE_H - 3}" text-anchor="end">'
           f'<title>{html.escape(label)}: {ops} operations, {busy} ms</title>'
           f'{html.escape(short)}</text>']
    bars = []  # [first bin, last bin, phase, level]: neighbours that look the same, merged
    for b in range(plot_w // _BIN):
        spent = {phase: bins[b] for phase, bins in cover.items() if bins[b] > 1e-9}
        if not spent:
            continue
        phase = max(spent, key=spent.get)
        # How busy the tensor was in this bin, as a bar height in quarters (at least one, so
        # that a short operation in a long trace still shows).
        level = max(1, min(4, math.ceil(4 * sum(spent.values()) / bin_us)))
        if bars and bars[-1][1] == b - 1 and bars[-1][2:] == [phase, level]:
            bars[-1][1] = b
        else:
            bars.append([b, b, phase, level])
    for first, last, phase, level in bars:
        h = _LANE_H * level / 4
        out.append(f'<rect x="{_LABEL_W + _BIN * first}" y="{y + _LANE_H - h:g}" '
                   f'width="{_BIN * (last - first + 1)}" height="{h:g}" fill="{colour(phase)}"/>')
    return out


def _axis(wall, plot_w, lanes_h):
    """The time axis above the lanes, with round ticks and grid lines."""
    step = _tick_step(wall / 1000)  # in ms
    unit, scale = ("s", 1000) if step >= 1000 else ("ms", 1)
    out = [f'<text x="{_LABEL_W - 12}" y="{_TOP - 7}" text-anchor="end">time ({unit})</text>']
    for i in range(int(wall / 1000 / step) + 1):
        tick = i * step
        x = _LABEL_W + plot_w * tick * 1000 / wall
        out.append(f'<line x1="{x:.1f}" y1="{_TOP - 4}" x2="{x:.1f}" y2="{_TOP + lanes_h - _GAP}" '
                   'stroke="#ccc" stroke-width="0.5"/>'
                   f'<text x="{x:.1f}" y="{_TOP - 7}" text-anchor="middle">{tick / scale:g}</text>')
    return out


def _legend(totals, y, width):
    """The phases present, the most time first, wrapped to the width; and the picture's height.

    Phases drawn in one colour (negotiations of different operations) share an entry.
    """
    names = {}
    for phase in sorted(totals, key=lambda p: -totals[p]):
        names.setdefault(colour(phase), []).append(phase)
    out, x = [], _LABEL_W
    for fill, phases in names.items():
        label = " / ".join(phases)
        item_w = 30 + 7 * len(label)  # 11px capitals are about 7px wide
        if x + item_w > width and x > _LABEL_W:
            x, y = _LABEL_W, y + 16
        out.append(f'<rect x="{x:.0f}" y="{y}" width="12" height="10" fill="{fill}"/>'
                   f'<text x="{x + 16:.0f}" y="{y + 9}">{html.escape(label)}</text>')
        x += item_w
    return out, y + 18


# --- the notebook side -----------------------------------------------------------------------

def _href(path):
    """A link relative to the kernel's folder, which is the notebook's in Jupyter."""
    return urllib.parse.quote(os.path.relpath(path).replace(os.sep, "/"))


def timeline_html(run, max_lanes=16):
    """HTML for a run whose timeline came back: a link to the file, how to open it, a picture.

    `run` is a `hvd_magic.Run` (or anything with ``id`` and ``timeline_path``).
    """
    path = getattr(run, "timeline_path", None)
    if not path or not os.path.exists(path):
        raise ValueError(f"run {run.id} has no timeline. {HOW_TO_RECORD}")
    size = os.path.getsize(path)
    if size <= PICTURE_MAX_BYTES:
        trace = Trace.load(path)
        facts = f"{trace.events} events, {_ms(trace.wall)} ms, {len(trace.tensors)} tensors"
        picture = svg(trace, max_lanes=max_lanes)
    else:
        facts = "too large to draw here"
        picture = ""
    name = os.path.relpath(path)
    return (
        '<div class="hvd-magic-timeline">'
        f'<div><b>Horovod timeline</b> of run {html.escape(run.id)}, rank 0: '
        f'<a href="{html.escape(_href(path))}" download="{html.escape(run.id)}-timeline.json" '
        f'target="_blank">{html.escape(name)}</a> ({_size(size)}; {facts})</div>'
        '<div style="font-size:90%">To explore it, download it, then open '
        '<a href="https://ui.perfetto.dev" target="_blank">ui.perfetto.dev</a> → '
        '<i>Open trace file</i>;<br>or in Chrome open <code>chrome://tracing</code> → '
        '<i>Load</i>.</div>'
        f'{picture}</div>')


def timeline_note(run):
    """One line of text output: where the run's timeline is and how to look at it."""
    path = os.path.relpath(run.timeline_path)
    return (f"timeline: {path} ({_size(os.path.getsize(run.timeline_path))}); "
            f"%horovod_timeline {run.id} draws it, ui.perfetto.dev opens it\n")


class TimelineNote:
    """A text view that also says where the run's timeline is when the run ends."""

    def __init__(self, view):
        self.view = view

    def __getattr__(self, name):
        return getattr(self.view, name)

    def finish(self, run):
        self.view.finish(run)
        if run.timeline_path and not getattr(self.view, "quiet", False):
            out = getattr(self.view, "stdout", None) or sys.stdout
            out.write(timeline_note(run))
            out.flush()


class RunRecord(NamedTuple):
    """What %horovod_timeline needs of a run, from this kernel's history or a run folder."""
    id: str
    run_dir: str
    timeline_path: Optional[str]
    started: Optional[float]
    np: Optional[int]
    state: str


def known_runs(run_root="hvd_runs"):
    """Runs of this kernel and run folders under `run_root` (earlier kernels), oldest first."""
    from . import api

    records = {}
    for meta_path in glob.glob(os.path.join(run_root, "*", "run.json")):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        run_dir = os.path.abspath(os.path.dirname(meta_path))
        path = os.path.join(run_dir, FILE_NAME)
        records[str(meta.get("id") or os.path.basename(run_dir))] = RunRecord(
            str(meta.get("id") or os.path.basename(run_dir)), run_dir,
            path if os.path.exists(path) else None, meta.get("started"), meta.get("np"),
            str(meta.get("state", "?")))
    for run in api.runs():  # this kernel's own runs know best (a running one has no file yet)
        records[run.id] = RunRecord(run.id, run.run_dir, run.timeline_path, run.started, run.np,
                                    run.state)
    return sorted(records.values(), key=lambda r: (r.started or 0, r.id))


def _pick(runs, run_id):
    with_timeline = [r for r in runs if r.timeline_path]
    available = ", ".join(r.id for r in with_timeline) or "none yet"
    if run_id is None:
        if not with_timeline:
            raise _usage(f"No run has a timeline yet. {HOW_TO_RECORD}")
        return with_timeline[-1]
    matches = [r for r in runs if r.id == run_id] or [r for r in runs if r.id.endswith(run_id)]
    if len(matches) != 1:
        what = "matches several runs" if matches else "is not a run of this kernel or hvd_runs/"
        raise _usage(f"{run_id!r} {what}. Runs with a timeline: {available}.")
    run = matches[0]
    if not run.timeline_path:
        if run.state in ("pending", "running"):
            raise _usage(f"run {run.id} is still running; its timeline comes back when it ends.")
        raise _usage(f"run {run.id} has no timeline. {HOW_TO_RECORD} "
                     f"Runs with a timeline: {available}.")
    return run


def _usage(message):
    from IPython.core.error import UsageError
    return UsageError(message)


def runs_table(runs):
    def started(r):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)) if r.started else ""

    rows = [[r.id, started(r), "" if r.np is None else r.np, r.state,
             _size(os.path.getsize(r.timeline_path))] for r in reversed(runs) if r.timeline_path]
    return Table("Runs with a timeline (newest first)", ["run", "started", "np", "state", "size"],
                 rows, "" if rows else f"None yet. {HOW_TO_RECORD}")


def timeline_magic(magics, line):
    """``%horovod_timeline [RUN] [--list | --path | --summary]`` (see `HorovodMagics`)."""
    from IPython.core.magic_arguments import parse_argstring

    args = parse_argstring(magics.horovod_timeline, line)
    if args.top is not None and args.top < 1:
        raise _usage("--top takes a positive number.")
    runs = known_runs(getattr(magics, "run_root", "hvd_runs"))
    if args.list:
        return runs_table(runs)
    run = _pick(runs, args.run)
    if args.path:
        return run.timeline_path
    if args.summary:
        return summarize(run.timeline_path, top=args.top or 10)
    from IPython.display import HTML
    return HTML(timeline_html(run, max_lanes=max(args.top or 16, 2)))
