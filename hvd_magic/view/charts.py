"""Charts of the metrics the ranks report: one SVG per metric, a line per rank; and each rank's
memory over time (its task's samples: `hvd_magic.driver.usage`), with its limit.

Drawn on the driver from `RankState.history` (nothing is drawn on the ranks), as plain SVG text:
the dashboard puts it in a widget while the run goes (a few times a second at most), and in the
same place of its static rendition when the run ends (as images: what a saved notebook, a
rendered page or a binder shows without a kernel). A rank that falls behind ends its line early;
a rank whose values diverge leaves the bundle; ranks with equal values (averaged metrics) share
one line drawn in their colours in turn.

A chart is read by a person: large enough for its ticks, a grid, "rank k" in the legend, and a
log axis where the values span more than two decades (a loss from 6.8 to 0.03 is a flat line
along the bottom on a linear one). The memory chart's y axis starts at 0, in MB (GB from 1 GB);
a rank's limit, where its cgroup's is below the host's memory, is a dashed line if it is in view
(at most `LIMIT_IN_VIEW` times the highest sample), else named below the plot.
"""

import base64
import html
import math

from ..words import size

# Tableau 10: told apart at a glance, also in print.
COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]
MAX_POINTS = 400            # per line: more are thinned evenly (the last one always kept)
WIDTH, HEIGHT = 440, 250    # px of one chart: two side by side in a notebook's width
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 34, 30  # the plot's margins: tick labels, title and legend
LOG_ABOVE = 100.0           # all values positive and max/min above this: a log y axis
LEGEND_RANKS = 6            # ranks named in a chart's legend; more are "+N more"
_DASH = 6                   # px of each rank's colour where several lines coincide
LIMIT_IN_VIEW = 2.0         # a memory limit up to this times the highest sample is drawn
_GRID = "#e6e6e6"


def series(ranks):
    """{metric: {rank: [(step, value), ...]}} of the numeric values in the ranks' histories."""
    out = {}
    for r in ranks:
        if hasattr(r.history, "numeric"):  # the driver's columns (driver/metrics.py)
            for name, (steps, values) in r.history.numeric().items():
                line = [(s, v) for s, v in zip(steps, values) if math.isfinite(v) and math.isfinite(s)]
                if line:
                    out.setdefault(name, {})[r.rank] = line
            continue
        for step, values in r.history:
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and math.isfinite(value) and isinstance(step, (int, float)):
                    out.setdefault(name, {}).setdefault(r.rank, []).append((step, value))
    return out


def _thin(points):
    if len(points) <= MAX_POINTS:
        return points
    stride = len(points) / (MAX_POINTS - 1)
    return [points[int(i * stride)] for i in range(MAX_POINTS - 1)] + [points[-1]]


def _label(value):
    """A value as a person reads it: "0.031", "918", "12,000"; an exponent only for the very
    large or small ("2.5e+07", "3e-06")."""
    if value and not 1e-4 <= abs(value) < 1e6:
        return f"{value:.2g}"
    text = f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return text if "e" not in text else f"{value:,.0f}"


def tick_labels(ticks):
    """Labels for a linear axis's ticks: as many decimals as their spacing needs, the same for
    each ("0.5", "1.0", "1.5"), thousands separated; `_label`'s for one tick or extremes."""
    step = min((b - a for a, b in zip(ticks, ticks[1:])), default=0)
    if not step or max(abs(t) for t in ticks) >= 1e6 or step < 1e-4:
        return [_label(t) for t in ticks]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return [f"{t:,.{decimals}f}" for t in ticks]


def nice_ticks(low, high, count=5):
    """Round values (1, 2 or 5 times a power of ten apart) from `low` to `high`, about `count`."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9)
    return [round(k * step, 12) for k in range(first, math.floor(high / step + 1e-9) + 1)]


def log_ticks(low, high):
    """Powers of ten from `low` to `high` (and 2 and 5 times them when there are few)."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    multiples = (1,) if len(decades) > 4 else (1, 2, 5)
    return [m * 10.0 ** d for d in decades for m in multiples if low <= m * 10.0 ** d <= high]


class Axes:
    """A chart's frame: steps `x0..x1` across, values `y0..y1` up (on a log scale where they
    span more than two decades and are all positive), its ticks, grid and labels as SVG."""

    whole_x = True  # ticks across at whole numbers only (steps)

    def __init__(self, x0, x1, y0, y1, width=WIDTH, height=HEIGHT):
        if x1 == x0:
            x0, x1 = x0 - 0.5, x1 + 0.5
        self.log = y0 > 0 and y1 / y0 > LOG_ABOVE
        if y1 == y0:
            y0, y1 = y0 - 0.5, y1 + 0.5
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1
        self.width, self.height = width, height
        self.plot_w, self.plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM
        self._ly0, self._ly1 = (math.log10(y0), math.log10(y1)) if self.log else (y0, y1)

    def x(self, step):
        return LEFT + (step - self.x0) / (self.x1 - self.x0) * self.plot_w

    def y(self, value):
        v = math.log10(max(value, 1e-300)) if self.log else value
        return TOP + (1 - (v - self._ly0) / (self._ly1 - self._ly0)) * self.plot_h

    def svg(self, last_step, caption=None):
        """The frame, a grid line and label per tick, and "step N" (the latest step) below, or
        `caption`."""
        bottom = TOP + self.plot_h
        parts = [f'<rect x="{LEFT}" y="{TOP}" width="{self.plot_w}" height="{self.plot_h}" '
                 f'fill="none" stroke="#bbb"/>']
        yticks = (log_ticks(self.y0, self.y1) if self.log
                  else nice_ticks(self.y0, self.y1, max(2, self.plot_h // 30)))
        labels = [_label(v) for v in yticks] if self.log else tick_labels(yticks)
        for value, label in zip(yticks, labels):
            y = self.y(value)
            parts.append(f'<line x1="{LEFT}" x2="{LEFT + self.plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                         f'stroke="{_GRID}"/><text x="{LEFT - 4}" y="{y + 3.5:.1f}" '
                         f'text-anchor="end" data-tick="y">{label}</text>')
        xticks = [t for t in nice_ticks(self.x0, self.x1, max(2, self.plot_w // 70))
                  if not self.whole_x or t == int(t)]  # (steps are whole)
        for step, label in zip(xticks, tick_labels(xticks)):
            x = self.x(step)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}" '
                         f'stroke="{_GRID}"/><text x="{x:.1f}" y="{bottom + 13}" '
                         f'text-anchor="middle" data-tick="x">{label}</text>')
        parts.append(f'<text x="{self.width - RIGHT}" y="{self.height - 3}" text-anchor="end" '
                     f'fill="#555">{_e(caption or f"step {_label(last_step)}")}</text>')
        return parts


def chart_open(name, axes, **data):
    """A chart's `<svg>` and title (the metric, and "log scale" where it is)."""
    if axes.log:
        data["scale"] = "log"
    extra = "".join(f' data-{k}="{html.escape(str(v))}"' for k, v in data.items())
    scale = ' <tspan font-weight="normal" fill="#757575">(log scale)</tspan>' if axes.log else ""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{axes.width}" height="{axes.height}" '
            f'font-family="sans-serif" font-size="11" data-metric="{html.escape(name)}"'
            f'{extra}>',
            f'<rect width="{axes.width}" height="{axes.height}" fill="white"/>',
            f'<text x="{LEFT}" y="14" font-weight="bold" font-size="13">{html.escape(name)}'
            f'{scale}</text>']


def _legend(ranks, axes, label="rank"):
    """ "rank k" (`label` k) in its colour for the first LEGEND_RANKS ranks, right-aligned above the plot."""
    shown = ranks[:LEGEND_RANKS]
    more = f"+{len(ranks) - len(shown)} more" if len(ranks) > len(shown) else ""
    parts, x = [], axes.width - RIGHT - 7 * len(more)
    if more:
        parts.append(f'<text x="{axes.width - RIGHT}" y="28" text-anchor="end" fill="#555">'
                     f'{more}</text>')
        x -= 8
    for rank in reversed(shown):
        text = f"{label} {rank}"
        x -= 7 * len(text) + 16
        colour = COLOURS[rank % len(COLOURS)]
        parts.append(f'<g data-legend="{rank}"><line x1="{x}" x2="{x + 12}" y1="24" y2="24" '
                     f'stroke="{colour}" stroke-width="2.5"/><text x="{x + 15}" y="28">{text}'
                     f'</text></g>')
    return parts


def chart_svg(name, lines, label="rank"):
    """One metric: `lines` is {rank: [(step, value), ...]} (`label`: what a line is, a sweep's
    "trial")."""
    points = [p for line in lines.values() for p in line]
    axes = Axes(min(p[0] for p in points), max(p[0] for p in points),
                min(p[1] for p in points), max(p[1] for p in points))
    last_step = max(p[0] for p in points)  # the axis says the latest step, as the table does
    parts = chart_open(name, axes) + axes.svg(last_step)
    drawn = {rank: " ".join(f"{axes.x(s):.1f},{axes.y(v):.1f}" for s, v in _thin(lines[rank]))
             for rank in sorted(lines)}
    parts += _polylines(drawn, label) + _legend(sorted(lines), axes, label)
    parts.append("</svg>")
    return "".join(parts)


def _polylines(drawn, label="rank"):
    """A line per rank of `drawn` ({rank: "x,y x,y ..."}), in its colour."""
    parts, same = [], {}  # the ranks whose lines are drawn on the same pixels (averaged metrics)
    for rank, coords in drawn.items():
        same.setdefault(coords, []).append(rank)
    for rank, coords in drawn.items():
        colour = COLOURS[rank % len(COLOURS)]
        group = same[coords]
        # Lines on top of each other are interleaved: the first solid, each next one a dash
        # of its own within a period, so that every rank's colour shows along the line.
        k, dash = group.index(rank), ""
        if k:
            dash = (f' stroke-dasharray="{_DASH} {_DASH * (len(group) - 1)}"'
                    f' stroke-dashoffset="{-_DASH * k}"')
        title = f"{label} {rank}" + (f" (same as {label} {', '.join(map(str, group[:k] + group[k + 1:]))})"
                                  if len(group) > 1 else "")
        parts.append(f'<polyline data-rank="{rank}" points="{coords}" fill="none" '
                     f'stroke="{colour}" stroke-width="1.8"{dash}><title>{title}</title>'
                     f'</polyline>')
        if " " not in coords:  # one point: a line of none, so a dot (its first rank's on top)
            x, y = coords.split(",")
            parts.append(f'<circle data-rank="{rank}" cx="{x}" cy="{y}" r="{3.5 - k}" '
                         f'fill="{colour}"><title>{title}</title></circle>')
    return parts


def chart_svgs(ranks, since=None):
    """Every metric's chart (SVG strings), in name order, and the memory chart last (once a
    rank's memory was sampled; its time counted from `since`, the cell's start)."""
    memory = memory_chart_svg(ranks, since)
    return ([chart_svg(name, lines) for name, lines in sorted(series(ranks).items())]
            + ([memory] if memory else []))


def charts_html(ranks, since=None):
    """Every metric's chart side by side, or "" when nothing numeric was reported."""
    return charts_box(chart_svgs(ranks, since))


def charts_box(charts, static=False):
    """Charts (SVG strings) side by side. `static`: each as an ``<img>`` of its SVG, which
    notebook viewers keep where they strip inline SVG from an untrusted notebook's HTML."""
    if not charts:
        return ""
    if static:
        charts = [f'<img alt="{html.escape(_metric_of(c))}" src="data:image/svg+xml;base64,'
                  f'{base64.b64encode(c.encode()).decode()}">' for c in charts]
    return ('<div class="hvd-magic-charts" style="display:flex;flex-wrap:wrap;gap:8px">'
            + "".join(charts) + "</div>")


def _metric_of(chart):
    start = chart.find('data-metric="') + len('data-metric="')
    return html.unescape(chart[start:chart.index('"', start)])


def summary_text(ranks):
    """A line per metric: each rank's last value, and its min and max (the text view's charts)."""
    lines = []
    for name, per_rank in sorted(series(ranks).items()):
        cells = []
        for rank in sorted(per_rank):
            values = [v for _, v in per_rank[rank]]
            cells.append(f"rank {rank} {_label(values[-1])} ({_label(min(values))}.."
                         f"{_label(max(values))})")
        lines.append(f"  {name}: last (min..max): " + "; ".join(cells) + "\n")
    return "".join(lines)


def picture_svg(ranks, per_row=2, charts=None, since=None):
    """Every chart in one SVG: the static picture a saved notebook keeps (`charts`: drawn
    already, e.g. a large run's bands)."""
    if charts is None:
        charts = chart_svgs(ranks, since)
    if not charts:
        return ""
    rows = math.ceil(len(charts) / per_row)
    width, height = WIDTH * min(per_row, len(charts)), HEIGHT * rows
    placed = [chart.replace("<svg ", f'<svg x="{WIDTH * (i % per_row)}" '
                                     f'y="{HEIGHT * (i // per_row)}" ', 1)
              for i, chart in enumerate(charts)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            + "".join(placed) + "</svg>")


# --- memory: each rank's resident memory over time, and its limit ----------------------------

def memory_series(ranks, since=None):
    """({rank: [(seconds since `since`, rss bytes), ...]}, {rank: its limit}) of the ranks'
    samples (`since`: a unix time, the cell's start; by default the first sample's); a limit
    only where the rank's cgroup's is below the host's memory."""
    lines = {r.rank: list(zip(*r.usage.memory()))
             for r in ranks if getattr(r, "usage", None) is not None}
    lines = {rank: line for rank, line in lines.items() if line}
    if not lines:
        return {}, {}
    first = min(t for line in lines.values() for t, _ in line)
    start = first if since is None else min(since, first)
    limits = {r.rank: r.usage.latest["limit"] for r in ranks if r.rank in lines
              and r.usage.latest.get("limit_of") == "cgroup" and r.usage.latest.get("limit")}
    return {rank: [(t - start, rss) for t, rss in line] for rank, line in lines.items()}, limits


class MemoryAxes(Axes):
    """The memory chart's frame: time across (s, min or h), memory up from 0 (MB or GB) to the
    highest sample, or to a limit up to LIMIT_IN_VIEW times higher."""

    whole_x = False

    def __init__(self, lines, limits):
        span = max(t for line in lines.values() for t, _ in line)
        top = max(rss for line in lines.values() for _, rss in line)
        top = max([top] + [v for v in limits.values() if v <= LIMIT_IN_VIEW * top])
        self.seconds, self.time_unit = next((per, unit) for per, unit in (
            (1, "s"), (60, "min"), (3600, "h")) if span / per <= 600 or unit == "h")
        self.bytes, self.unit = (1 << 30, "GB") if top >= 1 << 30 else (1 << 20, "MB")
        self.span = span
        super().__init__(0, span / self.seconds, 0, 1.1 * top / self.bytes)

    def point(self, t, rss):
        return f"{self.x(t / self.seconds):.1f},{self.y(rss / self.bytes):.1f}"

    def open(self, **data):
        """The chart's `<svg>`, title, frame and "N s" (the time sampled) below."""
        return (chart_open(f"memory ({self.unit})", self, memory=self.unit, **data)
                + self.svg(0, f"{self.span / self.seconds:.0f} {self.time_unit}"))

    def limits(self, limits):
        """A dashed line at each limit in view (in its rank's colour, grey where ranks share
        it), labelled in grey; the lowest of those above the plot named below it."""
        by_limit = {}
        for rank, limit in sorted(limits.items()):
            by_limit.setdefault(limit, []).append(rank)
        parts, above = [], []
        for limit, ranks in sorted(by_limit.items()):
            if limit / self.bytes > self.y1:
                above.append(limit)
                continue
            y = self.y(limit / self.bytes)
            who = (f"rank {ranks[0]}" if len(ranks) == 1 else
                   f"ranks {', '.join(map(str, ranks))}" if len(ranks) <= 3 else
                   f"{len(ranks)} ranks")
            colour = COLOURS[ranks[0] % len(COLOURS)] if len(ranks) == 1 else "#555"
            parts.append(f'<g data-limit="{limit}"><title>the limit of {who}: {size(limit)}, '
                         f'its cgroup\'s</title><line x1="{LEFT}" x2="{LEFT + self.plot_w}" '
                         f'y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" stroke-width="1.2" '
                         f'stroke-dasharray="5 4"/><text x="{LEFT + self.plot_w - 4}" '
                         f'y="{y - 4:.1f}" text-anchor="end" fill="#555" stroke="white" '
                         f'stroke-width="3" paint-order="stroke">limit '
                         f'{size(limit)} ({who})</text></g>')
        if above:
            parts.append(f'<text x="{LEFT}" y="{self.height - 3}" fill="#555" '
                         f'data-limit-above="{above[0]}">limit {size(above[0])}: above</text>')
        return parts


def memory_chart_svg(ranks, since=None):
    """Each rank's memory (rss) over time from `since` (`memory_series`), a line per rank,
    and its limit dashed; "" before any rank's memory was sampled."""
    lines, limits = memory_series(ranks, since)
    if not lines:
        return ""
    axes = MemoryAxes(lines, limits)
    drawn = {rank: " ".join(axes.point(t, rss) for t, rss in _thin(lines[rank]))
             for rank in sorted(lines)}
    return "".join(axes.open() + axes.limits(limits) + _polylines(drawn)
                   + _legend(sorted(lines), axes) + ["</svg>"])


def _e(text):
    return html.escape(str(text))
