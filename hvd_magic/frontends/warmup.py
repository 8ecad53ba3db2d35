"""The ranks' templates begun at ``%load_ext``, as the embedded Spark session is: the kernel's
template (`hvd_magic.template`) started in a thread and told to import what the notebook imports,
so that the first ``--np -N`` cell's ranks are forked at once instead of waiting for torch; the
embedded session's executor's template the same way, by the background start's first job
(`hvd_magic.launch.prestart`), for the first ``--np N`` cell.

What the notebook imports is read from its code, not guessed: the notebook file the kernel runs
(``JPY_SESSION_NAME``, which Jupyter Server gives its kernels; ipykernel's ``__session__``) and the
cells run so far, each cell's body without its magics, read by `hvd_magic.template.wanted` (only
modules safe to fork after import: torch, horovod.torch, numpy, pandas; never TensorFlow). A
notebook that imports none of them still gets the template itself started.

``HVD_MAGIC_PRESTART=0`` turns this off with the Spark start; ``--fresh`` runs never use it.
Not for: a cluster's executors (each one's first task starts its template).
"""

import ast
import json
import os
import threading

from ..config import fresh_by_default
from ..launch.prestart import switched_off

_started = None  # the thread of this kernel's warm-up, once begun


def to_hold(user_ns, environ=os.environ):
    """The modules the ranks' templates hold from the start: the forkable ones the notebook's
    code imports; None where nothing is begun at load (HVD_MAGIC_PRESTART=0, or --fresh ranks
    by default)."""
    if switched_off(environ) or fresh_by_default():
        return None
    from ..template import wanted
    return wanted({"sources": notebook_sources(user_ns, environ)})


def begin(modules):
    """Start the kernel's template in a thread, holding `modules` (`to_hold`); the thread, or
    None where there is nothing to begin (or it was begun already)."""
    global _started
    if _started is not None or modules is None:
        return None
    _started = threading.Thread(target=_hold, args=(modules,), name="hvd-magic-template-warm-up",
                                daemon=True)
    _started.start()
    return _started


def _hold(modules):
    from ..task.environ import rank_base_env
    from ..template import client
    client.hold(rank_base_env(), modules)


def notebook_sources(user_ns, environ=os.environ):
    """{name: Python source} of the notebook's code cells (from its file, where the kernel knows
    it) and of the cells run so far, each without its magics."""
    cells = [str(c) for c in (user_ns or {}).get("In", ()) if c]
    path = environ.get("JPY_SESSION_NAME") or (user_ns or {}).get("__session__")
    if path and str(path).endswith(".ipynb") and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                notebook = json.load(f)
            cells += ["".join(c.get("source", "")) if isinstance(c.get("source"), list)
                      else str(c.get("source", "")) for c in notebook.get("cells", ())
                      if c.get("cell_type") == "code"]
        except (OSError, ValueError, AttributeError):
            pass
    return {f"cell {i}": python_of(cell) for i, cell in enumerate(cells)}


def python_of(cell):
    """A cell's Python: a cell magic's body (``%%horovod``'s is the ranks' code); a line magic's
    argument where it is Python (``%time import torch``), else ``pass`` (``%pip install x``), as
    a shell command is (each line kept, so that blocks still parse)."""
    lines = cell.splitlines()
    if lines and lines[0].startswith("%%"):
        lines = lines[1:]
    return "\n".join(_python_line(line) for line in lines)


def _python_line(line):
    code = line.lstrip()
    if not code.startswith(("%", "!")):
        return line
    indent = line[:len(line) - len(code)]
    argument = code.split(None, 1)[1] if code.startswith("%") and " " in code else ""
    try:
        ast.parse(argument)
    except (SyntaxError, ValueError):
        argument = ""
    return indent + (argument.strip() or "pass")
