"""`Stacks`: every rank's Python stack, and the grouped view a person reads.

A mapping rank -> that rank's stack as text (every thread, like a traceback). Shown (``str``,
IPython's display, the dashboard's Stacks panel, the stall watchdog's report) it is grouped:
ranks whose main thread is at the same place are one entry, headed by the innermost line of the
user's own code and what it called::

    ranks 0-2, 4-7: Cell In[3], line 5, in step → allreduce
    rank 3: data.py:88 in read_batch → sleep

the frames of the frameworks and the standard library folded ("… 6 frames of horovod"), so that
np 256 reads as a few groups, not 256 stacks. `threads` keeps what the ranks sent (frames, and
each user's frame's locals), `missing` the ranks that gave none and why.
"""

import html
import os

from ..errors import name_cells

_CELL = "<hvd_magic cell "
_WRAPPERS = {"wrapper", "wrapped", "inner", "_fn", "decorate_context"}  # decorators' frames


def rank_ranges(ranks):
    """"rank 3", "ranks 0-2, 4-7"."""
    ranks = sorted(ranks)
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(parts)}"


def place(frame):
    """Where a frame is, shortly: ``Cell In[3], line 5, in step``, ``train.py:42 in step``."""
    filename, lineno, name = frame[0], frame[1], frame[2]
    if filename.startswith(_CELL):
        where = f"Cell In[{filename[len(_CELL):].rstrip('>')}], line {lineno}"
        return where if name == "<module>" else f"{where}, in {name}"
    return f"{os.path.basename(filename)}:{lineno} in {name}"


def package(filename):
    """The package or module a library frame belongs to: ``horovod``, ``threading``."""
    if filename.startswith("<frozen "):  # <frozen importlib._bootstrap>, <frozen runpy>
        return filename[len("<frozen "):].rstrip(">").split(".")[0]
    parts = filename.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1].removesuffix(".py")
    if "hvd_magic" in parts:
        return "hvd_magic"
    return os.path.splitext(parts[-1])[0].strip("<>") or filename


def main_thread(threads):
    """The thread that matters: the main one (the cell's), else the first."""
    return next((t for t in threads if t.get("main")), threads[0] if threads else None)


def headline(frames):
    """The innermost line of the user's code, and what it called: ``x.py:4 in f → allreduce``."""
    users = [i for i, f in enumerate(frames) if f[4]]
    if not users:
        return place(frames[-1]) if frames else "no Python frames"
    i = users[-1]
    # a decorator's frame (torch.distributed wraps every collective in `wrapper`) says nothing:
    # the first frame past it with a name of its own is what the user's line called
    names = [f[2] for f in frames[i + 1:] if f[2] not in _WRAPPERS] or [f[2] for f in frames[i + 1:]]
    called = f" → {names[0]}" if names else ""
    return place(frames[i]) + called


def frame_lines(frames, fold=True):
    """A traceback's lines (outermost first), runs of library frames folded into one line."""
    lines, run = [], []

    def flush():
        if run and not lines and len(run) < len(frames):
            run.clear()  # the interpreter's and hvd_magic's start, before the user's code
        if run:
            names = sorted({package(f[0]) for f in run})
            calls = run[0][2] if len(run) == 1 else f"{run[0][2]} … {run[-1][2]}"
            lines.append(f"  … {len(run)} frame{'s' if len(run) > 1 else ''} of "
                         f"{', '.join(names)} ({calls})")
            run.clear()

    for f in frames:
        if fold and not f[4]:
            run.append(f)
            continue
        flush()
        lines.append(name_cells(f'  File "{f[0]}", line {f[1]}, in {f[2]}'))
        if f[3]:
            lines.append(f"    {f[3]}")
    flush()
    return lines


def thread_text(thread, fold=False):
    return "\n".join([f"Thread {thread['name']}{' (main)' if thread.get('main') else ''}:"]
                     + frame_lines(thread["frames"], fold))


def _others(threads, main):
    """The other threads in one line each, hvd_magic's own left out."""
    lines = []
    for t in threads:
        if t is main or str(t["name"]).startswith("hvd-magic"):
            continue
        lines.append(f"  + thread {t['name']}: {headline(t['frames'])}")
    return lines


class Stacks(dict):
    """rank -> the rank's stack as text, every thread; shown grouped (`text`)."""

    def __init__(self, run_id, threads, missing, how=None, seconds=None, collectives=None):
        super().__init__({r: "\n\n".join(thread_text(t) for t in ts) for r, ts in threads.items()})
        self.run_id = run_id
        self.collectives = collectives or {}  # rank -> [{"group", "seq", "op"}] (rank/stacks.py)
        self.threads = threads       # rank -> [{"name", "main", "frames", "locals"}]
        self.missing = missing       # rank -> why it gave no stack
        self.how = how or {}         # rank -> "python" or "faulthandler" (no locals)
        self.seconds = seconds       # how long the answers took

    def groups(self):
        """[(ranks, threads of the first)] of ranks whose main thread is at the same place."""
        by_place = {}
        for rank in sorted(self.threads):
            main = main_thread(self.threads[rank])
            key = tuple((f[0], f[1], f[2]) for f in main["frames"]) if main else ()
            by_place.setdefault(key, []).append(rank)
        return [(ranks, self.threads[ranks[0]]) for ranks in by_place.values()]

    def text(self, fold=True):
        """The grouped view: an entry per place, then the ranks that gave no stack."""
        took = f", in {self.seconds:.2f} s" if self.seconds is not None else ""
        groups = self.groups()
        out = [f"Stacks of run {self.run_id}: {len(groups)} "
               f"group{'s' if len(groups) != 1 else ''} of {len(self.threads)} "
               f"rank{'s' if len(self.threads) != 1 else ''}{took}"]
        out.extend(where_in_collectives(self.collectives))
        for ranks, threads in groups:
            main = main_thread(threads)
            frames = main["frames"] if main else []
            note = "" if self.how.get(ranks[0]) != "faulthandler" else \
                " [from faulthandler: the rank holds the GIL; no locals]"
            out.append(f"{rank_ranges(ranks)}: {headline(frames)}{note}")
            out.extend(frame_lines(frames, fold))
            out.extend(_others(threads, main))
        reasons = {}
        for rank, why in sorted(self.missing.items()):
            reasons.setdefault(why, []).append(rank)
        for why, ranks in reasons.items():
            out.append(f"{rank_ranges(ranks)}: no stack ({why})")
        return "\n".join(out)

    def __str__(self):
        return self.text()

    def _repr_pretty_(self, p, cycle):
        p.text(self.text())

    def _repr_html_(self):
        return stacks_html(self)


def where_in_collectives(collectives):
    """Lines saying where the ranks are in each group's collectives, furthest first: "in
    collectives (torch's Flight Recorder): ranks 0, 2-3 at #58 gloo:all_reduce; rank 1 at #57
    gloo:all_reduce (behind)", or of JAX's waits as the ranks count them (group ``jax``); none
    when no rank said (no group made, no collective yet)."""
    groups, sources = {}, {}
    for rank, entries in collectives.items():
        for entry in entries:
            group = str(entry.get("group"))
            sources.setdefault(group, entry.get("by") or "torch's Flight Recorder")
            groups.setdefault(group, {}).setdefault(
                (entry.get("seq", 0), str(entry.get("op"))), []).append(rank)
    torch_groups = [g for g in groups if sources[g] == "torch's Flight Recorder"]
    lines = []
    for group, places in sorted(groups.items()):
        ordered = sorted(places.items(), key=lambda p: -p[0][0])
        parts = [f"{rank_ranges(sorted(ranks))} at #{seq} {op}" + (" (behind)" if i else "")
                 for i, ((seq, op), ranks) in enumerate(ordered)]
        where = f" of group {group}" if group in torch_groups and len(torch_groups) > 1 else ""
        lines.append(f"in collectives{where} ({sources[group]}): {'; '.join(parts)}")
    return lines


def stacks_html(stacks):
    """The grouped view as HTML: each group's frames, a user's frame's locals a click away."""
    parts = [f"<div style='font-family:monospace;font-size:12px'><b>"
             f"{html.escape(stacks.text().splitlines()[0])}</b>"]
    parts.extend(f"<div>{html.escape(line)}</div>"
                 for line in where_in_collectives(stacks.collectives))
    for ranks, threads in stacks.groups():
        main = main_thread(threads)
        frames = main["frames"] if main else []
        parts.append(f"<details open><summary><b>{html.escape(rank_ranges(ranks))}</b>: "
                     f"{html.escape(headline(frames))}</summary><div style='margin-left:1em'>")
        for i, f in enumerate(frames):
            local_values = (main.get("locals") or {}).get(str(i))
            if not f[4]:
                continue
            line = html.escape(f"{place(f)}: {f[3]}")
            if local_values:
                rows = "".join(f"<tr><td>{html.escape(n)}</td><td>{html.escape(_shown(v))}</td></tr>"
                               for n, v in local_values.items())
                parts.append(f"<details><summary>{line}</summary><table>{rows}</table></details>")
            else:
                parts.append(f"<div>{line}</div>")
        parts.extend(f"<div>{html.escape(x)}</div>" for x in _others(threads, main))
        parts.append("</div></details>")
    for rank, why in sorted(stacks.missing.items()):
        parts.append(f"<div>rank {rank}: no stack ({html.escape(why)})</div>")
    return "".join(parts) + "</div>"


def _shown(value):
    """A captured local (`hvd_magic.rank.frames.bounded`) as text."""
    kind, v = value
    return v if kind == "r" else repr(tuple(v) if kind == "t" else v)
