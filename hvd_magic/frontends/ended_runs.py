"""The runs of this notebook that ended with an earlier kernel, said once by the next
``%load_ext``: which (by run id and name), how far they got, where their logs are.

A kernel restarted (or killed) mid-run takes its runs with it: the ranks end with their parent,
and the page never hears of it (its dashboard keeps its last snapshot: `hvd_magic.view.rendition`).
Each run's ``run.json`` says which notebook and kernel ran it (`RunFolder.write_meta`): a run whose
kernel was told to shut down as it ended (a restart: cancelled, ``kernel.ending``), or one still
"running" whose kernel process is gone (killed), ended with its kernel. Each is said once, then
marked in its ``run.json`` so that later kernels do not say it again.

Not for: runs of this kernel (`hvd_magic.runs()`), or other notebooks' runs.
"""

import glob
import json
import os

from ..words import plural

UNENDED = ("pending", "preparing", "running")
SHOWN_RANKS = 4   # ranks named one by one in the line; the others are counted


def said(run_root, environ=os.environ):
    """The line to say at load (None where no run of this notebook ended with a kernel)."""
    notebook = environ.get("JPY_SESSION_NAME")
    if not notebook:
        return None
    ended = []
    for path in sorted(glob.glob(os.path.join(run_root, "*", "run.json"))):
        meta = _read(path)
        if meta is not None and _ended_with_kernel(meta, notebook):
            ended.append(meta)
            meta["said_after_kernel"] = os.getpid()
            _write(path, meta)
    if not ended:
        return None
    runs = "; ".join(_run_words(meta, run_root) for meta in ended)
    return (f"hvd_magic: {plural(len(ended), 'run')} of this notebook ended with its previous "
            f"kernel, which went before {'it' if len(ended) == 1 else 'they'} did: {runs}.")


def _ended_with_kernel(meta, notebook):
    kernel = meta.get("kernel") or {}
    if meta.get("notebook") != notebook or "said_after_kernel" in meta or \
            kernel.get("pid") in (None, os.getpid()):
        return False
    if meta.get("state") in UNENDED:  # its kernel never wrote its end: gone, unless alive
        return not _alive(kernel["pid"])
    return bool(kernel.get("ending")) and meta.get("state") == "cancelled"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now: not our kernel
        return False
    return True


def _run_words(meta, run_root):
    name = f" ({meta['name']})" if meta.get("name") else ""
    how = ("cancelled as the kernel shut down" if meta.get("state") == "cancelled"
           else f"still {meta.get('state')} when the kernel went")
    took = ""
    if meta.get("started") and meta.get("ended"):
        took = f" {meta['ended'] - meta['started']:.0f} s in"
    ranks = meta.get("ranks") or []
    shown = [_rank_words(r) for r in ranks[:SHOWN_RANKS]]
    if len(ranks) > SHOWN_RANKS:
        shown.append(f"{plural(len(ranks) - SHOWN_RANKS, 'more rank')}")
    folder = os.path.join(run_root, str(meta.get("id")))
    return (f"run {meta.get('id')}{name}, {plural(len(ranks), 'rank')}, {how}{took}: "
            f"{', '.join(shown)}; logs in {folder}/")


def _rank_words(rank):
    where = f"rank {rank.get('rank')}"
    if rank.get("step") is not None:
        total = f"/{rank['total']}" if rank.get("total") else ""
        return f"{where} at step {rank['step']}{total}"
    line = (rank.get("last_line") or "").strip()
    if line:
        return f"{where} last printed {line[:60]!r}"
    return f"{where} {rank.get('state', 'pending')}"


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):  # being written, or not ours: nothing to say of it
        return None


def _write(path, meta):
    temporary = path + ".said"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    os.replace(temporary, path)
