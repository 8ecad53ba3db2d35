"""What ``%load_ext`` starts in the background, read from the notebook's own cells: the embedded
Spark session (`hvd_magic.launch.prestart`), sized for the most ranks a cell asks of Spark, where
a cell uses Spark (``--np N``, N > 0; ``%%horovod`` without ``--np``, whose default is N; a
pyspark import), with the executor's rank template begun by its first job; and the kernel's rank
template (`hvd_magic.template`) in a thread, where a cell runs ranks on this machine (``--np
-N``). Each template only where the cells import a framework it holds: it is told to import
them (torch, horovod.torch, numpy, pandas; never TensorFlow), so that the first cell's ranks are
forked at once instead of waiting for torch. A notebook whose cells use none of it gets nothing.

What the notebook's cells are is read from its code, not guessed: the notebook file the kernel
runs (``JPY_SESSION_NAME``, which Jupyter Server gives its kernels; ipykernel's ``__session__``)
and the cells run so far, each cell's body without its magics, read by `hvd_magic.template.wanted`.
Where no notebook file is known (a console, a script), Spark and the template start as they
always did: nothing says what the cells will be.

Nothing starts on a machine too small for it (fewer than `MIN_CORES` cores, or less than
`MIN_AVAILABLE_GB` of memory available: a JVM and a template holding torch take about 1.5 GB);
``HVD_MAGIC_PRESTART=0`` turns all of it off (said in the one line); ``--fresh`` runs never use
the templates. Not for: a cluster's executors (each one's first task starts its template).
"""

import ast
import json
import os
import re
import threading
from typing import NamedTuple

from ..config import fresh_by_default
from ..launch import prestart
from ..words import plural

MIN_CORES = 2
MIN_AVAILABLE_GB = 4.0

_started = None  # the thread of this kernel's warm-up, once begun

# a line of ours that places ranks: %%horovod, %%distributed, %horovod script.py, a session start
_RUNS = re.compile(r"^[ \t]*%{1,2}(horovod|distributed|horovod_session)\b(.*)$", re.M)
_NP = re.compile(r"(?:--np|-n)(?:[ \t]+|=)(-?\d+)")
_API_NP = re.compile(r"(?:hvd_magic|HorovodRunner).*\bnp\s*=\s*(-?\d+)")
_PYSPARK = re.compile(r"^[ \t]*(?:import|from)[ \t]+pyspark\b", re.M)


class Uses(NamedTuple):
    """What a notebook's cells will run: `spark_np`, the most ranks a cell asks of Spark (None:
    no cell uses Spark); `driver`, whether a cell runs ranks on this machine (--np -N);
    `hold`, the forkable modules the cells import; `known`, whether its saved cells were read."""
    spark_np: object
    driver: bool
    hold: list
    known: bool


def uses(user_ns, default_np, environ=os.environ):
    """The `Uses` of the notebook the kernel runs."""
    from ..template import wanted
    cells, known = notebook_cells(user_ns, environ)
    spark, driver = [], False
    for cell in cells:
        asked = [_np_of(m.group(2), default_np) for m in _RUNS.finditer(cell)
                 if m.group(1) != "horovod_session" or " start" in f" {m.group(2)}"]
        asked += [int(n) for n in _API_NP.findall(cell)]
        if _PYSPARK.search(cell):
            asked.append(max(default_np, 1))
        spark += [n for n in asked if n > 0]
        driver = driver or any(n < 0 for n in asked)
    sources = {f"cell {i}": python_of(cell) for i, cell in enumerate(cells)}
    return Uses(max(spark) if spark else None, driver, wanted({"sources": sources}), known)


def _np_of(options, default_np):
    found = _NP.findall(options)
    return int(found[-1]) if found else default_np


def too_small(environ=os.environ):
    """Why this machine is too small to start anything before it is asked for, or None."""
    cores = os.cpu_count() or 1
    if cores < MIN_CORES:
        return f"this machine has {plural(cores, 'CPU core')}"
    available = _available_gb()
    if available is not None and available < MIN_AVAILABLE_GB:
        return f"{available:.1f} GB of memory available, under {MIN_AVAILABLE_GB:g} GB"
    return None


def _available_gb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:  # not Linux: not known, not refused
        pass
    return None


def start(user_ns, magics, environ=os.environ):
    """Start in the background what this notebook's cells will use (see the module's text);
    the one line to say of it, or None where nothing was started and nothing needs saying."""
    if prestart.switched_off(environ):
        return None
    plan = uses(user_ns, magics.np, environ)
    spark_np = plan.spark_np if plan.known else max(magics.np, plan.spark_np or 0, 1)
    kernel_template = (plan.driver or not plan.known) and not fresh_by_default()
    hold = None if fresh_by_default() else plan.hold
    if plan.known and not plan.hold:  # no framework to import: no template to begin
        kernel_template, hold = False, None
    if spark_np is None and not kernel_template:
        return None
    small = too_small(environ)
    if small is not None:
        return (f"hvd_magic: nothing started in the background ({small}); each cell starts "
                f"what it needs.")
    started, said = [], None
    if spark_np is not None:
        said = prestart.begin(user_ns, spark_np, magics.spark_conf, magics.run_root, hold)
        if prestart.current() is not None:
            started.append(f"Spark ({prestart.describe()}) for %%horovod --np N")
    if kernel_template and begin(hold or []) is not None:
        held = f" (importing {', '.join(hold)})" if hold else ""
        started.append(f"the ranks' template{held} for --np -N")
    spark_started = prestart.current() is not None
    unstarted = said if spark_np is not None and not spark_started else None  # (pyspark broken)
    if not started:
        return unstarted
    first, *more = started
    first = first.replace(" for ", " in the background for ", 1)
    why = ("this notebook's cells use it" if plan.known else
           "the notebook's cells are not known here")
    spark_words = "; a SparkSession your code builds stops Spark first" if spark_started else ""
    line = (f"hvd_magic: starting {', and '.join([first, *more])} ({why}){spark_words}. "
            f"{prestart.ENV}=0 turns this off.")
    return f"{unstarted}\n{line}" if unstarted else line


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


def notebook_cells(user_ns, environ=os.environ):
    """([the source of each code cell], whether the notebook's file was read): the cells of the
    notebook file the kernel runs, where it knows it, and the cells run so far."""
    cells = [str(c) for c in (user_ns or {}).get("In", ()) if c]
    path = environ.get("JPY_SESSION_NAME") or (user_ns or {}).get("__session__")
    if path and str(path).endswith(".ipynb") and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                notebook = json.load(f)
            cells += ["".join(c.get("source", "")) if isinstance(c.get("source"), list)
                      else str(c.get("source", "")) for c in notebook.get("cells", ())
                      if c.get("cell_type") == "code"]
            return cells, True
        except (OSError, ValueError, AttributeError):
            pass
    return cells, False


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
