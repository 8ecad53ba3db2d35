"""Ranks forked from a template: an interpreter per host that has already imported the frameworks.

A fresh rank spends most of its start importing torch and Horovod (1.35 s of 1.9 s at np 2, and
far more when eight ranks import at once on two cores). A template imports them once; each run's
ranks are forked from it and are from then on fresh ranks like any other (same bootstrap, events
and stopping), with their own environment, folder, streams and process group. No state passes
from one run to the next: every run gets newly forked ranks.

- `client.py` (task side): find or start this host's template, ask it for a rank, a Popen-like
  handle back;
- `server.py` (the template process): imports what it is asked to hold, forks ranks, reaps them
  and reports each one's exit status, ends with its owner or when idle;
- `child.py` (in the forked rank, before the rank's own entry runs): session, streams,
  environment, folder, signals, thread counts.

Which modules a template holds comes from what the jobs import (`wanted`). Only modules that are
safe to fork after import are held (`FORKABLE`); TensorFlow is not one of them: its import starts
threads of its own and its multi-worker strategies use gRPC, which is not fork-safe, so a
TensorFlow cell's ranks import it themselves (still forked, from a template holding the rest).
"""

import ast
import threading

from ..needs import installed

# A module a job imports -> what the template imports for it, in this order. Nothing here starts
# a thread at import with the template's environment (one thread per library: `server.py`),
# initialises Horovod or touches a GPU.
FORKABLE = {
    "numpy": ("numpy",),
    "pandas": ("numpy", "pandas"),
    "torch": ("numpy", "torch"),
    "horovod.torch": ("numpy", "torch", "horovod.torch"),
}


# CPython 3.11 keeps the AST builder's recursion depth per interpreter, not per thread: two
# threads parsing at once (the tasks of a --np -N run are threads of the notebook) can fail with
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). Seen in a
# fresh clone's run: task 0 failed there and its rank never started.
_parsing = threading.Lock()


def imported_names(job):
    """Every module name a job imports: the names the capture found (``job["imports"]``) and the
    import statements of its sources (a script's text, a cell's)."""
    names = set(job.get("imports", ()))
    for source in (job.get("sources") or {}).values():
        try:
            with _parsing:
                tree = ast.parse(source)
        except (SyntaxError, ValueError, SystemError):  # (another thread's parse: see above)
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def wanted(job, path=()):
    """The modules a template should hold before this job's ranks are forked, in import order
    (`path`: the ranks' PYTHONPATH folders, which come first)."""
    found = []
    for name in sorted(imported_names(job)):
        for module, needs in FORKABLE.items():
            if (name == module or name.startswith(module + ".")) and \
                    all(installed(n, path) for n in needs):  # (a rank that imports one says so)
                found.extend(n for n in needs if n not in found)
    order = [n for needs in FORKABLE.values() for n in needs]
    return sorted(set(found), key=order.index)
