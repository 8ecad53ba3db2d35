"""Timelines in the notebook: the HTML the dashboard shows at the end of a run, the text
view's note, and ``%horovod_timeline`` (list, path, summary, picture of a run's timeline).

Not for: exploring a trace in depth. Perfetto's UI does that far better; this
gives the glance that tells you whether it is worth opening them.
"""

import base64
import glob
import html
import json
import os
import sys
import time
import urllib.parse
from typing import NamedTuple, Optional

from . import ranks, ranks_picture
from .picture import svg
from .summary import Summary, Table, _ms, _size, summarize
from .trace import FILE_NAME, HOW_TO_RECORD, PICTURE_MAX_BYTES, Trace, finalize

# (Chromium has removed chrome://tracing; Perfetto's UI reads the file in the browser, and
# caches itself for use offline once it was opened online)
OFFLINE = ("Offline: ui.perfetto.dev works without the internet once it was opened online "
           "(it caches itself; the file never leaves the browser); without it, "
           "%horovod_timeline RUN --summary gives the tables here")


# --- the notebook side -----------------------------------------------------------------------

def _href(path):
    """A link relative to the kernel's folder, which is the notebook's in Jupyter."""
    return urllib.parse.quote(os.path.relpath(path).replace(os.sep, "/"))


def kept_picture(svg_text, alt):
    """An SVG picture as an image of it, which a saved notebook keeps wherever it is opened:
    JupyterLab strips inline SVG from an untrusted notebook's HTML and leaves its texts, a
    jumble (seen in the browser test). The numbers its shapes' titles gave are in the tables."""
    if not svg_text.startswith("<svg"):
        return svg_text
    image = base64.b64encode(svg_text.encode()).decode()
    return (f'<div class="hvd-magic-picture"><img alt="{html.escape(alt)}" '
            f'style="max-width:100%" src="data:image/svg+xml;base64,{image}"></div>')


def timeline_html(run, max_lanes=16):
    """HTML for a run whose timeline came back: a link to the file, how to open it, a picture.

    `run` is a `hvd_magic.Run` (or anything with ``id`` and ``timeline_path``).
    """
    path = getattr(run, "timeline_path", None)
    if not path or not os.path.exists(path):
        raise ValueError(f"run {run.id} has no timeline. {HOW_TO_RECORD}")
    if path.endswith(ranks.FILE_NAME):
        return ranks_html(run, path, max_lanes=max(max_lanes, 32))
    size = os.path.getsize(path)
    verdict = ""
    if size <= PICTURE_MAX_BYTES:
        trace = Trace.load(path)
        facts = f"{trace.events} events, {_ms(trace.wall)} ms, {len(trace.tensors)} tensors"
        picture = kept_picture(svg(trace, max_lanes=max_lanes), "Horovod timeline, rank 0")
        verdict = f": <b>{html.escape(Summary(trace).verdict())}</b>"
    else:
        facts = "too large to draw here"
        picture = ""
    name = os.path.relpath(path)
    return (
        '<div class="hvd-magic-timeline">'
        f'<div><b>Horovod timeline</b> of run {html.escape(run.id)}, rank 0{verdict}</div>'
        f'<div><a href="{html.escape(_href(path))}" download="{html.escape(run.id)}-'
        f'timeline.json" target="_blank">{html.escape(name)}</a> ({_size(size)}; {facts})</div>'
        f'<div style="font-size:90%">To explore it, download it, then open '
        f'<a href="https://ui.perfetto.dev" target="_blank">ui.perfetto.dev</a> → '
        f'<i>Open trace file</i>. {html.escape(OFFLINE)}</div>'
        f'{picture}</div>')


def ranks_html(run, path, max_lanes=32):
    """HTML for a run whose ranks' torch profiles came back merged (`timelines.ranks`): the
    verdict, the file, a lane per rank and the table per step and rank."""
    timeline = ranks.RanksTimeline.load(path)
    whose = {"tensorflow": "TensorFlow", "jax": "JAX"}.get(timeline.framework, "torch")
    picture = kept_picture(ranks_picture.svg(timeline, max_lanes=max_lanes), "every rank's steps")
    clocks = "; ".join(
        f"rank {r['rank']} ({html.escape(str(r['host']))}) "
        + ("clock unknown" if r["uncertainty_us"] is None else
           f"{round(r['offset_us'] / 1000, 2) + 0:+.2f} ms ± {r['uncertainty_us'] / 1000:.2f}")
        + (f", {r['cut_events']} short events left out" if r["cut_events"] else "")
        for r in timeline.ranks[:8]) + ("; ..." if len(timeline.ranks) > 8 else "")
    return (
        '<div class="hvd-magic-timeline">'
        f'<div><b>{whose} profile</b> of run {html.escape(run.id)}, every rank: '
        f'<b>{html.escape(timeline.verdict())}</b></div>'
        f'<div><a href="{html.escape(_href(path))}" download="{html.escape(run.id)}-'
        f'{ranks.FILE_NAME}" target="_blank">{html.escape(os.path.relpath(path))}</a> '
        f'({_size(os.path.getsize(path))}; opens in ui.perfetto.dev, a process per rank: '
        f'{html.escape(OFFLINE)}). Clocks against the notebook\'s: {clocks}.</div>'
        f'{picture}'
        f'{ranks_picture.table(timeline)._repr_html_()}</div>')


def timeline_note(run):
    """Text output: where the run's timeline is and how to look at it; for a Horovod timeline,
    the rank the others waited on."""
    path = os.path.relpath(run.timeline_path)
    verdict = ""
    if not path.endswith(ranks.FILE_NAME) and \
            os.path.getsize(run.timeline_path) <= PICTURE_MAX_BYTES:
        verdict = f"timeline verdict: {summarize(run.timeline_path).verdict()}\n"
    return (f"timeline: {path} ({_size(os.path.getsize(run.timeline_path))}); "
            f"%horovod_timeline {run.id} draws it, ui.perfetto.dev opens it\n{verdict}")


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
    profile: Optional[dict] = None  # --timeline without Horovod: the window asked for


def known_runs(run_root="hvd_runs"):
    """Runs of this kernel and run folders under `run_root` (earlier kernels), oldest first."""
    from ..driver.history import runs as this_kernels_runs

    records = {}
    ours = {run.id: run for run in this_kernels_runs()}
    for meta_path in glob.glob(os.path.join(run_root, "*", "run.json")):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        run_dir = os.path.abspath(os.path.dirname(meta_path))
        path = os.path.join(run_dir, FILE_NAME)
        if meta.get("id") not in ours and os.path.exists(path + ".part"):
            finalize(run_dir)  # a run whose notebook died while the timeline streamed in
        if not os.path.exists(path):  # a torch run's profiles, merged
            path = os.path.join(run_dir, ranks.FILE_NAME)
        records[str(meta.get("id") or os.path.basename(run_dir))] = RunRecord(
            str(meta.get("id") or os.path.basename(run_dir)), run_dir,
            path if os.path.exists(path) else None, meta.get("started"), meta.get("np"),
            str(meta.get("state", "?")), meta.get("profile"))
    for run in ours.values():  # this kernel's own runs know best (a running one has no file yet)
        records[run.id] = RunRecord(run.id, run.run_dir, run.timeline_path, run.started, run.np,
                                    run.state, run.profile)
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
        how = (ranks.nothing_recorded(run.profile, run.run_dir, run.np) if run.profile
               else HOW_TO_RECORD)
        raise _usage(f"run {run.id} has no timeline. {how} Runs with a timeline: {available}.")
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
    if args.summary and run.timeline_path.endswith(ranks.FILE_NAME):
        return ranks_picture.table(ranks.RanksTimeline.load(run.timeline_path))
    if args.summary:
        return summarize(run.timeline_path, top=args.top or 10)
    from IPython.display import HTML
    return HTML(timeline_html(run, max_lanes=max(args.top or 16, 2)))
