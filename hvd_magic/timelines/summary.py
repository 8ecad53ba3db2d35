"""Tables of where a timeline's time went: top tensors and operations (``--summary``)."""

import bisect
import html

from .trace import Trace, _is_operation, _union, exclusive_shares


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
    say), ``share`` (of the timeline's wall time, each moment split evenly among the tensors in
    flight then, or among the phases then innermost: a column that adds up to the share of the
    wall anything was in flight, `busy`, whatever fused tensors overlap).
    `waited_on`: the rank the others waited on in the negotiations (`verdict`).
    """

    def __init__(self, trace, path=None, top=10):
        self.path = path
        self.top = top
        self.wall_us = trace.wall
        self.events = trace.events
        self.negotiations = trace.negotiations
        tensors, operations = {}, {}
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
            if s.depth == 0:
                t["total_us"] += duration
            if _is_operation(s):
                t["count"] += 1
                if s.nbytes is not None:
                    t["bytes"] = s.nbytes
                    o["bytes"] = (o["bytes"] or 0) + s.nbytes
        whole = [s for s in trace.spans if not s.cut]
        by_tensor = exclusive_shares([(s.tensor, s.start, s.end) for s in whole if s.depth == 0])
        by_phase = exclusive_shares(_innermost(whole))
        self.busy = sum(by_tensor.values()) / self.wall_us if self.wall_us else 0.0
        for shares, rows in ((by_tensor, tensors), (by_phase, operations)):
            for name, row in rows.items():
                row["mean_us"] = row["total_us"] / row["count"] if row["count"] else None
                row["share"] = shares.get(name, 0.0) / self.wall_us if self.wall_us else 0.0
        by_total = lambda row: -row["total_us"]  # noqa: E731
        self.tensors = sorted(tensors.values(), key=by_total)
        self.operations = sorted(operations.values(), key=by_total)

    def waited_on(self):
        """{rank: (negotiations it was the last ready of, µs the first ready waited for it)}
        over the negotiations with two ranks' readiness or more (tensors negotiated at once
        wait at once: a wall-clock time, each moment counted once)."""
        waits = {}
        for n in self.negotiations:
            if len(n.ready) > 1:
                waits.setdefault(n.ready[-1][0], []).append((n.ready[0][1], n.ready[-1][1]))
        return {rank: (len(spans), _union(spans)) for rank, spans in waits.items()}

    def verdict(self):
        """One line: the rank the others waited on longest in all, as the torch profile's
        verdict says it (`timelines.ranks`); what it cost them."""
        waits = self.waited_on()
        if not waits:
            return ("no rank's readiness was recorded (Horovod ticks each rank ready under a "
                    "collective's NEGOTIATE bar, but not once its response cache knows the "
                    "collective: --timeline turns the cache off, a timeline() window does not)")
        counts = sum(c for c, _ in waits.values())
        worst = max(waits, key=lambda r: waits[r][1])
        count, total = waits[worst]
        kinds = sorted({n.name.removeprefix("NEGOTIATE_").lower() for n in self.negotiations
                        if len(n.ready) > 1})
        return (f"rank {worst} was ready last at {count} of {counts} collectives "
                f"({', '.join(kinds)}); the first ready waited {_ms(total)} ms on it in all "
                f"({_ms(total / count)} ms each time)")

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
                f"{_ms(self.wall_us)} ms of wall time, a tensor in flight {100 * self.busy:.1f}% "
                f"of it (the shares below add up to that: each moment split among what was in "
                f"flight). {self.verdict()[0].upper()}{self.verdict()[1:]}.")

    def __repr__(self):
        return "\n\n".join([self._headline()] + [repr(t) for t in self.tables()])

    def _repr_html_(self):
        return (f"<div>{html.escape(self._headline())}</div>"
                + "".join(t._repr_html_() for t in self.tables()))


def _innermost(spans):
    """[(phase, start, end)]: each span's time less its own activities' (a span one deeper of
    the same tensor within it), so that a moment counts for the innermost phase alone."""
    inner = {}
    for s in spans:
        if s.depth:
            inner.setdefault((s.tensor, s.depth - 1), []).append((s.start, s.end))
    ends = {}
    for key, pieces in inner.items():
        pieces.sort()  # (a tensor's activities follow one another: their ends are in order too)
        ends[key] = [end for _, end in pieces]
    out = []
    for s in spans:
        at, key = s.start, (s.tensor, s.depth)
        pieces = inner.get(key, ())
        for start, end in pieces[bisect.bisect_right(ends.get(key, ()), s.start):]:
            if start >= s.end:
                break
            if start > at:
                out.append((s.name, at, start))
            at = max(at, end)
        if s.end > at:
            out.append((s.name, at, s.end))
    return out


def summarize(path, top=10):
    """The `Summary` of the timeline file at `path`."""
    return Summary(Trace.load(path), path=path, top=top)
