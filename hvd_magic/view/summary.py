"""A run of many ranks, read at a glance: what the dashboard and the text view show above
`SUMMARY_ABOVE` ranks instead of a row (or a line) per rank.

- counts of ranks by state;
- progress as a distribution (min, median, max, a ten-bucket histogram) with the slowest ranks
  named;
- one row per host, with the sum of its ranks' memory;
- the ranks with the most memory: now, their peak, their share of their limit;
- the outliers pinned, each with its own row: failed ranks, stalled ones (waiting in a collective,
  or silent for `STALLED_AFTER` seconds), the slowest;
- charts with the mean across ranks and the min-max band (per-rank lines on request), memory's
  too;
- `RankPicker`: any rank's row and log, one number away.

Everything here is a plain function of the run's state (and `RankPicker` of one widget's value),
so it costs the same at 1024 ranks as the header does: O(ranks) per drawing, a few times a second,
never per event.

Not for: runs of `SUMMARY_ABOVE` ranks or fewer (a row per rank reads fine there:
`hvd_magic.view.dashboard`), or anything on disk.
"""

import collections
import heapq
import html
import statistics
import time

from ..words import size
from .charts import (COLOURS, RIGHT, WIDTH, Axes, MemoryAxes, chart_open, charts_box,
                     memory_series)

SUMMARY_ABOVE = 16       # more ranks than this: the summary, not a row per rank
STALLED_AFTER = 30.0     # seconds a running rank may be silent before it is pinned as stalled
SLOWEST = 5              # slowest ranks named and pinned
MOST_MEMORY = 5          # ranks named as those with the most memory
BINS = 120               # x positions of a band chart
_LIVE = ("pending", "starting", "rendezvous", "running")


def _e(text):
    return html.escape(str(text), quote=True)


def _label(value):
    return f"{value:.3g}"


# --- what the summary says ----------------------------------------------------------------------

def outliers(ranks, now=None):
    """{"failed": [...], "stalled": [...], "slowest": [...]} RankStates, each list short."""
    now = time.monotonic() if now is None else now
    failed = [r for r in ranks if r.state in ("failed", "timeout")]
    stalled = [r for r in ranks if r.state in _LIVE and r.state != "pending"
               and (r.blocked_since is not None or now - r.last_event > STALLED_AFTER)]
    stepped = [r for r in ranks if r.state == "running" and isinstance(r.step, (int, float))]
    top = max((r.step for r in stepped), default=None)
    slowest = sorted((r for r in stepped if r.step < top), key=lambda r: (r.step, r.rank))[:SLOWEST]
    return {"failed": failed[:SLOWEST * 2], "stalled": stalled[:SLOWEST * 2], "slowest": slowest}


def progress(ranks):
    """(min, median, max, total, histogram of 10 buckets) of the ranks' steps, or None."""
    steps = [r.step for r in ranks if isinstance(r.step, (int, float))]
    if not steps:
        return None
    totals = [r.total for r in ranks if isinstance(r.total, (int, float)) and r.total > 0]
    total = max(totals) if totals else None
    top = total or max(steps) or 1
    histogram = [0] * 10
    for step in steps:
        histogram[min(9, max(0, int(10 * step / top)))] += 1
    return min(steps), statistics.median(steps), max(steps), total, histogram


def hosts(ranks):
    """[(host, its ranks)] in the order hosts first appear."""
    by_host = collections.OrderedDict()
    for r in ranks:
        by_host.setdefault(r.host or "?", []).append(r)
    return list(by_host.items())


def threads_text(ranks):
    """"1 CPU thread per rank" (or "1-2 …" where they differ); "" before any rank said."""
    counts = sorted({int(r.threads) for r in ranks if str(r.threads or "").isdigit()})
    if not counts:
        return ""
    low, high = counts[0], counts[-1]
    return f"{low if low == high else f'{low}-{high}'} CPU thread{'s' if high > 1 else ''} per rank"


def _latest(r):
    """The rank's newest resources sample, or None."""
    return getattr(getattr(r, "usage", None), "latest", None)


def most_memory(ranks, count=MOST_MEMORY):
    """The `count` ranks with the most memory now (their newest sample), most first."""
    sampled = [r for r in ranks if _latest(r) is not None]
    return heapq.nsmallest(count, sampled, key=lambda r: (-_latest(r).get("rss", 0), r.rank))


def host_memory(members):
    """(the sum of the ranks' memory now, the host's available memory in the newest sample),
    or None before any sample."""
    latest = [e for e in map(_latest, members) if e is not None]
    if not latest:
        return None
    newest = max(latest, key=lambda e: e.get("time") or 0)
    return sum(e.get("rss", 0) for e in latest), newest.get("free")


def _counts(ranks):
    return collections.Counter(r.state for r in ranks)


def _steps_text(ranks):
    p = progress(ranks)
    if p is None:
        return ""
    low, median, high, total, _ = p
    of = f" of {total}" if total else ""
    return f"step min {low} · median {median:g} · max {high}{of}"


# --- the dashboard's summary (HTML) -----------------------------------------------------------

def summary_html(run, row_html, table_head, state_html):
    """The dashboard's table above SUMMARY_ABOVE ranks. `row_html(rank_state)` and `table_head`
    (a ``<table>`` and its head row) are the dashboard's own, so that a pinned rank's row reads
    as it does in a small run."""
    ranks = run.ranks
    counts = " · ".join(f"{n} {state_html(state)}" for state, n in sorted(_counts(ranks).items()))
    parts = [f"<div data-summary='states'><b>{len(ranks)} ranks</b>: {counts}</div>"]
    p = progress(ranks)
    if p is not None:
        bars = "".join(f"<span title='{n} ranks' style='display:inline-block;width:6px;"
                       f"height:{2 + round(14 * n / len(ranks))}px;background:#4e79a7;"
                       f"margin-right:1px'></span>" for n in p[4])
        parts.append(f"<div data-summary='progress'>{_e(_steps_text(ranks))} "
                     f"<span style='display:inline-flex;align-items:flex-end;height:16px'>"
                     f"{bars}</span></div>")
    pinned = outliers(ranks)
    rows = []
    for why, members in pinned.items():
        for r in members:
            rows.append(row_html(r).replace("<tr ", f"<tr data-pinned='{why}' ", 1)
                        .replace("</tr>", f"<td style='padding:0 .6em'><i>{why}</i></td></tr>", 1))
    if rows:
        parts.append("<div><b>pinned</b>: failed, stalled, slowest</div>"
                     f"{table_head}{''.join(rows)}</table></div>")  # (table_head opens both)
    parts.append(_most_memory_html(ranks))
    host_rows = []
    for host, members in hosts(ranks):
        states = ", ".join(f"{n} {s}" for s, n in sorted(_counts(members).items()))
        threads = threads_text(members)
        memory = host_memory(members)
        memory = "" if memory is None else size(memory[0]) + (
            f" · {size(memory[1])} free" if memory[1] is not None else "")
        host_rows.append(f"<tr data-host='{_e(host)}'>" + _cells(
            host, f"{len(members)}{' · ' + threads if threads else ''}", states,
            _steps_text(members), memory) + "</tr>")
    parts.append(_table(("host", "ranks", "states", "progress", "memory"), host_rows))
    return "<div class='hvd-magic-summary'>" + "".join(parts) + "</div>"


def _cells(*texts):
    return "".join(f"<td style='padding:0 .6em'>{_e(text)}</td>" for text in texts)


def _table(head, rows):
    return ("<table style='border-collapse:collapse;margin-bottom:.4em'><tr>"
            + "".join(f"<th style='text-align:left;padding:0 .6em'>{name}</th>" for name in head)
            + "</tr>" + "".join(rows) + "</table>")


def _most_memory_html(ranks):
    """The ranks with the most memory: now, peak, share of the limit (red past NEAR_LIMIT)."""
    rows = []
    for r in most_memory(ranks):
        latest = _latest(r)
        rss, limit = latest.get("rss", 0), latest.get("limit") or 0
        whose = "its cgroup's" if latest.get("limit_of") == "cgroup" else "the host's memory"
        # (resident memory counts shared pages in full; the limit, once: never "104%")
        share = "" if not limit else f"{rss / limit:.0%} of {size(limit)}" if rss < limit \
            else f"at its {size(limit)}"
        style = "padding:0 .6em" + (";color:#c62828" if r.usage.near_limit() else "")
        rows.append(f"<tr data-memory-rank='{r.rank}'>" + _cells(r.rank, r.host or "?",
                                                                 size(rss), size(r.usage.peak_rss))
                    + f"<td style='{style}' title='{_e(whose)}'>{_e(share)}</td></tr>")
    if not rows:
        return ""
    return ("<div data-summary='memory'><b>most memory</b></div>"
            + _table(("rank", "host", "now", "peak", "of its limit"), rows))


class RankPicker:
    """A rank number box and one panel: that rank's row and log (the per-rank accordion of a
    small run would be a thousand widgets). `row_html(r)`, `table_head` and `log_html(rank)` are
    the dashboard's; `lines` is a checkbox asking for a line per rank in the charts."""

    def __init__(self, run, row_html, table_head, log_html):
        import ipywidgets as w
        self.run = run
        self._row_html, self._table_head, self._log_html = row_html, table_head, log_html
        first = (outliers(run.ranks)["failed"] or run.ranks)[0].rank
        self.selector = w.BoundedIntText(value=first, min=0, max=run.np - 1, description="rank",
                                         layout=w.Layout(width="12em"))
        self.lines = w.Checkbox(value=False, description="a line per rank in the charts",
                                indent=False)
        self.panel = w.HTML(self.render())
        self.box = w.VBox([w.HBox([self.selector, self.lines]), self.panel])

    @property
    def rank(self):
        return self.selector.value

    def render(self):
        r = self.run.ranks[self.rank]
        return (f"{self._table_head}{self._row_html(r)}</table></div>"
                f"{self._log_html(self.run, r.rank)}")


# --- charts: the mean and the min-max band ------------------------------------------------------

PER_RANK = 2000          # points of a rank a band chart reads at most (evenly thinned)


def band_series(ranks):
    """{metric: (x, mean, low, high, ranks)}: across ranks, each rank's mean per bin of steps.

    One pass of numpy over every rank's points at once (at most `PER_RANK` of each), not a loop
    per rank: 1024 ranks' charts are redrawn in milliseconds."""
    import numpy as np
    per_metric = collections.defaultdict(list)
    for r in ranks:
        numeric = getattr(r.history, "numeric", None)
        if numeric is None:
            continue
        for name, (steps, values) in numeric().items():
            stride = max(1, len(values) // PER_RANK)
            per_metric[name].append((np.asarray(steps, float)[::stride],
                                     np.asarray(values, float)[::stride]))
    out = {}
    for name, columns in per_metric.items():
        drawn = _bands(columns)
        if drawn is not None:
            out[name] = drawn
    return out


def _bands(columns):
    """(x, mean, low, high, count) of `columns`, [(xs, values)] numpy arrays a rank: each
    rank's mean per bin of x, then across ranks; None where no value is finite."""
    import numpy as np
    lengths = [len(v) for _, v in columns]
    owner = np.repeat(np.arange(len(columns)), lengths)
    steps = np.concatenate([s for s, _ in columns])
    values = np.concatenate([v for _, v in columns])
    keep = np.isfinite(steps) & np.isfinite(values)
    if not keep.any():
        return None
    owner, steps, values = owner[keep], steps[keep], values[keep]
    x0, x1 = float(steps.min()), float(steps.max())
    span = (x1 - x0) or 1.0
    index = owner * BINS + np.minimum(BINS - 1, ((steps - x0) / span * BINS).astype(int))
    cells = len(columns) * BINS
    counts = np.bincount(index, minlength=cells)
    with np.errstate(invalid="ignore", divide="ignore"):
        matrix = (np.bincount(index, weights=values, minlength=cells) / counts).reshape(
            len(columns), BINS)
    filled = ~np.all(np.isnan(matrix), axis=0)
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(matrix[:, filled], axis=0)
        low, high = np.nanmin(matrix[:, filled], axis=0), np.nanmax(matrix[:, filled], axis=0)
    x = x0 + (np.arange(BINS)[filled] + 0.5) * span / BINS
    return x, mean, low, high, len(columns)


def band_chart_svg(name, x, mean, low, high, count):
    """One metric: the mean across ranks as a line, min-max as a band (the per-rank charts'
    axes: ticks, a log scale where values span decades)."""
    axes = Axes(float(x.min()), float(x.max()), float(low.min()), float(high.max()))

    def xy(px, py):
        return f"{axes.x(px):.1f},{axes.y(py):.1f}"

    # (the axis says the latest step: the last bin's middle, rounded)
    return "".join(chart_open(name, axes, band=count) + axes.svg(round(float(x.max())))
                   + _band(xy, x, mean, low, high, count) + ["</svg>"])


def _band(xy, x, mean, low, high, count):
    """The mean's line and the min-max band, through `xy(x, value)`: "x,y" on the chart."""
    band = " ".join([xy(a, b) for a, b in zip(x, high)]
                    + [xy(a, b) for a, b in zip(x[::-1], low[::-1])])
    line = " ".join(xy(a, b) for a, b in zip(x, mean))
    return [f'<text x="{WIDTH - RIGHT}" y="28" text-anchor="end" fill="#555">mean, min-max of '
            f'{count} ranks</text>',
            f'<polygon data-band="min-max" points="{band}" fill="{COLOURS[0]}" '
            f'fill-opacity="0.25" stroke="none"/>',
            f'<polyline data-band="mean" points="{line}" fill="none" stroke="{COLOURS[0]}" '
            f'stroke-width="1.8"/>']


def memory_band_svg(ranks, since=None):
    """The ranks' memory over time (from `since`: `memory_series`): the mean across ranks and
    the min-max band, and the lowest limit below the hosts' dashed; "" before any sample."""
    import numpy as np
    lines, limits = memory_series(ranks, since)
    drawn = _bands([(np.array([t for t, _ in line], float), np.array([v for _, v in line], float))
                    for line in lines.values()]) if lines else None
    if drawn is None:
        return ""
    axes = MemoryAxes(lines, limits)
    lowest = {rank: v for rank, v in limits.items() if v == min(limits.values())}
    return "".join(axes.open(band=drawn[-1]) + axes.limits(lowest)
                   + _band(axes.point, *drawn) + ["</svg>"])


def band_charts(ranks, since=None):
    """Every metric's band chart (SVG strings), in name order, and memory's last (once
    sampled; its time from `since`, the cell's start)."""
    memory = memory_band_svg(ranks, since)
    return ([band_chart_svg(name, *drawn) for name, drawn in sorted(band_series(ranks).items())]
            + ([memory] if memory else []))


def band_charts_html(ranks, since=None):
    return charts_box(band_charts(ranks, since))


# --- the text view's summary --------------------------------------------------------------------

def summary_line(run):
    """One line for the text view while a large run goes."""
    ranks = run.ranks
    counts = ", ".join(f"{n} {s}" for s, n in sorted(_counts(ranks).items()))
    parts = [f"[hvd_magic] {len(ranks)} ranks: {counts}"]
    steps = _steps_text(ranks)
    if steps:
        parts.append(steps)
    pinned = outliers(ranks)
    for why in ("failed", "stalled", "slowest"):
        if pinned[why]:
            parts.append(f"{why}: " + ", ".join(
                f"rank {r.rank}" + (f" (step {r.step})" if why == "slowest" else "")
                for r in pinned[why]))
    return " · ".join(parts) + "\n"


def summary_text(run):
    """The text view's end of a large run: states, hosts, outliers, metrics across ranks."""
    lines = [summary_line(run)]
    for host, members in hosts(run.ranks):
        states = ", ".join(f"{n} {s}" for s, n in sorted(_counts(members).items()))
        steps, threads = _steps_text(members), threads_text(members)
        lines.append(f"  {host}: {len(members)} ranks{' (' + threads + ')' if threads else ''}, "
                     f"{states}{' · ' + steps if steps else ''}\n")
    for name, (x, mean, low, high, count) in sorted(band_series(run.ranks).items()):
        lines.append(f"  {name}: last mean {_label(mean[-1])} (min {_label(low[-1])}, "
                     f"max {_label(high[-1])} across {count} ranks)\n")
    return "".join(lines)


def is_large(run):
    """Whether `run` is shown summarised."""
    return (getattr(run, "np", 0) or 0) > SUMMARY_ABOVE
