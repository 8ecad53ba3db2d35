"""Charts of the metrics the ranks report: one small SVG per metric, a line per rank.

Drawn on the driver from `RankState.history` (nothing is drawn on the ranks), as plain SVG text:
the dashboard puts it in a widget while the run goes (a few times a second at most), and shows it
once more as a static picture when the run ends, so that a saved notebook, a rendered page or a
binder shows the curves without a kernel. A rank that falls behind ends its line early; a rank
whose values diverge leaves the bundle; ranks with equal values (averaged metrics) share one
line drawn in their colours in turn.
"""

import html
import math

# Tableau 10: told apart at a glance, also in print.
COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]
MAX_POINTS = 400            # per line: more are thinned evenly (the last one always kept)
WIDTH, HEIGHT = 300, 150
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 8, 20, 22
_DASH = 6                   # px of each rank's colour where several lines coincide


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
    return f"{value:.3g}"


def chart_svg(name, lines):
    """One metric: `lines` is {rank: [(step, value), ...]}."""
    points = [p for line in lines.values() for p in line]
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    last_step = x1  # the axis says the latest step, as the table does
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def xy(p):
        return (_LEFT + (p[0] - x0) / (x1 - x0) * plot_w,
                _TOP + (1 - (p[1] - y0) / (y1 - y0)) * plot_h)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'font-family="sans-serif" font-size="10" data-metric="{html.escape(name)}">',
             f'<text x="{_LEFT}" y="12" font-weight="bold">{html.escape(name)}</text>',
             f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
             f'stroke="#ccc"/>',
             f'<text x="{_LEFT - 4}" y="{_TOP + 8}" text-anchor="end">{_label(y1)}</text>',
             f'<text x="{_LEFT - 4}" y="{_TOP + plot_h}" text-anchor="end">{_label(y0)}</text>',
             f'<text x="{_LEFT}" y="{HEIGHT - 6}">{_label(x0)}</text>',
             f'<text x="{WIDTH - _RIGHT}" y="{HEIGHT - 6}" text-anchor="end">step {_label(last_step)}'
             f'</text>']
    drawn = {rank: " ".join(f"{x:.1f},{y:.1f}" for x, y in map(xy, _thin(lines[rank])))
             for rank in sorted(lines)}
    same = {}  # the ranks whose lines are drawn on the same pixels (e.g. averaged metrics)
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
        title = f"rank {rank}" + (f" (same as rank {', '.join(map(str, group[:k] + group[k + 1:]))})"
                                  if len(group) > 1 else "")
        parts.append(f'<polyline data-rank="{rank}" points="{coords}" fill="none" '
                     f'stroke="{colour}" stroke-width="1.5"{dash}><title>{title}</title>'
                     f'</polyline>')
    legend_x = _LEFT + 70
    for i, rank in enumerate(sorted(lines)[:8]):
        x = legend_x + i * 28
        parts.append(f'<text x="{x}" y="12" fill="{COLOURS[rank % len(COLOURS)]}">'
                     f'■{rank}</text>')
    parts.append("</svg>")
    return "".join(parts)


def charts_html(ranks):
    """Every metric's chart side by side, or "" when nothing numeric was reported."""
    charts = [chart_svg(name, lines) for name, lines in sorted(series(ranks).items())]
    if not charts:
        return ""
    return ('<div class="hvd-magic-charts" style="display:flex;flex-wrap:wrap;gap:8px">'
            + "".join(charts) + "</div>")


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


def picture_svg(ranks, per_row=3, charts=None):
    """Every chart in one SVG: the static picture a saved notebook keeps (`charts`: drawn
    already, e.g. a large run's bands)."""
    if charts is None:
        charts = [chart_svg(name, lines) for name, lines in sorted(series(ranks).items())]
    if not charts:
        return ""
    rows = math.ceil(len(charts) / per_row)
    width, height = WIDTH * min(per_row, len(charts)), HEIGHT * rows
    placed = [chart.replace("<svg ", f'<svg x="{WIDTH * (i % per_row)}" '
                                     f'y="{HEIGHT * (i // per_row)}" ', 1)
              for i, chart in enumerate(charts)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            + "".join(placed) + "</svg>")
