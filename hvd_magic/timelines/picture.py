"""An SVG picture of a timeline: a lane per tensor, Horovod's phases as coloured spans."""

import html
import math

from .summary import _ms
from .trace import _is_operation



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
