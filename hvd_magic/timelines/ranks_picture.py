"""Every rank's profiled steps drawn (SVG, offline): a lane per rank, its steps, its time inside
collectives and, inside that, its wait for the last rank to arrive; and the table per step and
rank (`hvd_magic.timelines.ranks`)."""

import html

from .picture import _tick_step
from .summary import Table, _ms

STEP, COLLECTIVE, WAITING = "#dfe7f1", "#f28e2b", "#e15759"
LABEL, WIDTH, LANE = 120, 900, 20
MOST_ROWS = 48  # per-step rows in the table; beyond, a row per rank


def svg(timeline, max_lanes=32):
    """The picture of a `RanksTimeline`: at most `max_lanes` ranks (the first ones)."""
    ranks = sorted(timeline.steps)[:max_lanes]
    spans = [s for r in ranks for s in timeline.steps[r]]
    if not spans:
        return "<div>no profiled step came back</div>"
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    scale = (WIDTH - LABEL - 10) / max(end - start, 1.0)

    def x(t):
        return LABEL + (min(max(t, start), end) - start) * scale

    top, parts = 24, []
    waits = timeline.waits()
    for lane, rank in enumerate(ranks):
        y = top + lane * (LANE + 4)
        parts.append(f'<text x="{LABEL - 6}" y="{y + LANE - 6}" text-anchor="end">rank {rank}</text>')
        for i, (a, b) in enumerate(timeline.steps[rank]):
            parts.append(f'<rect x="{x(a):.1f}" y="{y}" width="{max(x(b) - x(a), 0.5):.1f}" '
                         f'height="{LANE}" fill="{STEP}" stroke="#8da0b6" stroke-width="0.5">'
                         f'<title>rank {rank}, step {timeline.first_step + i}: '
                         f'{_ms(b - a)} ms</title></rect>')
        for name, spans in timeline.collectives:
            if rank in spans:
                a, b = spans[rank]
                parts.append(f'<rect x="{x(a):.1f}" y="{y + 3}" width="{max(x(b) - x(a), 0.5):.1f}" '
                             f'height="{LANE - 6}" fill="{COLLECTIVE}"><title>rank {rank}: '
                             f'{html.escape(name)}, {_ms(b - a)} ms</title></rect>')
        for name, last, waited, spans in waits:
            if rank in waited and waited[rank] > 0:
                a = spans[rank][0]
                b = min(a + waited[rank], spans[rank][1])
                parts.append(f'<rect x="{x(a):.1f}" y="{y + 3}" width="{max(x(b) - x(a), 0.5):.1f}" '
                             f'height="{LANE - 6}" fill="{WAITING}"><title>rank {rank} waited '
                             f'{_ms(waited[rank])} ms in {html.escape(name)} for rank {last}'
                             f'</title></rect>')
    bottom = top + len(ranks) * (LANE + 4)
    tick = _tick_step(end - start)
    t = 0.0
    while t <= end - start:
        parts.append(f'<line x1="{x(start + t):.1f}" y1="{top - 4}" x2="{x(start + t):.1f}" '
                     f'y2="{bottom}" stroke="#ccc" stroke-width="0.5"/>'
                     f'<text x="{x(start + t):.1f}" y="{top - 8}" text-anchor="middle">'
                     f'{t / 1000:g} ms</text>')
        t += tick
    legend = (f'<rect x="{LABEL}" y="{bottom + 6}" width="10" height="10" fill="{STEP}" '
              f'stroke="#8da0b6"/><text x="{LABEL + 14}" y="{bottom + 15}">step (its own work)'
              f'</text><rect x="{LABEL + 150}" y="{bottom + 6}" width="10" height="10" '
              f'fill="{COLLECTIVE}"/><text x="{LABEL + 164}" y="{bottom + 15}">in a collective'
              f'</text><rect x="{LABEL + 280}" y="{bottom + 6}" width="10" height="10" '
              f'fill="{WAITING}"/><text x="{LABEL + 294}" y="{bottom + 15}">waiting for the '
              f'last rank to arrive</text>')
    height = bottom + 24
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" style="font:11px sans-serif;max-width:100%">'
            + "".join(parts) + legend + "</svg>")


def table(timeline):
    """The table per profiled step and rank (a row per rank, its steps' means, where that would
    be more than `MOST_ROWS` rows)."""
    rows = timeline.table()
    columns = ["step", "rank", "step ms", "in collectives ms", "waiting ms"]
    if len(rows) <= MOST_ROWS:
        body = [[r["step"], r["rank"], _ms(r["step_us"]), _ms(r["collective_us"]),
                 _ms(r["waiting_us"])] for r in sorted(rows, key=lambda r: (r["step"], r["rank"]))]
        return Table("Each profiled step, on each rank", columns, body)
    body = []
    for rank in sorted({r["rank"] for r in rows}):
        mine = [r for r in rows if r["rank"] == rank]
        body.append([f"{mine[0]['step']}-{mine[-1]['step']}", rank] +
                    [_ms(sum(r[k] for r in mine) / len(mine))
                     for k in ("step_us", "collective_us", "waiting_us")])
    return Table("The profiled steps on each rank (means)", columns, body)
