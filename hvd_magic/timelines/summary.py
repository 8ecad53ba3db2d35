"""Tables of where a timeline's time went: top tensors and operations (``--summary``)."""

import html

from .trace import Trace, _is_operation, _union



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
