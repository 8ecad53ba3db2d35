"""The trials of a sweep: the points of a grid, or random draws from it.

``"lr=1e-3,1e-2,1e-1; width=64,128"`` (the ``--sweep`` option) and ``{"lr": [...], "width":
[...]}`` (``hvd_magic.sweep(params=...)``) are the same space: each name a list of values. A
value of the text form is read as a Python literal (``1e-3``, ``64``, ``'adam'``), else kept
as text. ``--search random:N`` draws N points of it (a tuple ``(low, high)`` in the Python form
is a range drawn uniformly, log-uniformly when ``log=True`` is asked through `random_points`).

Not for: running the trials (`hvd_magic.sweeps.runner`) or Optuna's samplers.
"""

import ast
import itertools
import random

from IPython.core.error import UsageError

EXAMPLE = '--sweep "lr=1e-3,1e-2,1e-1; width=64,128"'


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_space(text):
    """{name: [values]} from ``"lr=1e-3,1e-2; width=64,128"``; a UsageError naming the part
    that is not ``name=v1,v2``."""
    text = str(text).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # (IPython's argument split keeps a magic line's quotes)
    space = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, eq, values = part.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise UsageError(f"--sweep: {part!r} is not name=value,value,... (one per "
                             f"parameter, separated by ';'), e.g. {EXAMPLE}.")
        listed = [_literal(v.strip()) for v in values.split(",") if v.strip()]
        if not listed:
            raise UsageError(f"--sweep: {name} has no values; give them as {name}=a,b,c.")
        if name in space:
            raise UsageError(f"--sweep: {name} is given twice; list its values once: "
                             f"{name}=a,b,c.")
        space[name] = listed
    if not space:
        raise UsageError(f"--sweep needs at least one parameter, e.g. {EXAMPLE}.")
    return space


def check_space(params):
    """`params` as {name: list of values, or a (low, high) range}, or a UsageError."""
    if isinstance(params, str):
        return parse_space(params)
    if not isinstance(params, dict) or not params:
        raise UsageError(f"params takes a dict of names to lists of values, e.g. "
                         f"{{'lr': [1e-3, 1e-2], 'width': [64, 128]}}, not {params!r}.")
    space = {}
    for name, values in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise UsageError(f"params: {name!r} is not a name a function or cell can read.")
        if isinstance(values, tuple) and len(values) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            space[name] = values  # a range: random searches only
        elif isinstance(values, (list, tuple, range)) and len(values) > 0:
            space[name] = list(values)
        else:
            raise UsageError(f"params[{name!r}] takes a non-empty list of values (or a "
                             f"(low, high) range for a random search), not {values!r}.")
    return space


def grid(space):
    """Every combination, the first name's values slowest, as dicts."""
    ranges = [n for n, v in space.items() if isinstance(v, tuple)]
    if ranges:
        raise UsageError(f"a grid sweep lists values; {', '.join(ranges)} given as a "
                         f"(low, high) range needs a random search: --search random:N.")
    names = list(space)
    return [dict(zip(names, combo)) for combo in itertools.product(*space.values())]


def random_points(space, n, seed=None, log=()):
    """`n` points: a listed parameter's value picked at random, a (low, high) range's drawn
    uniformly (log-uniformly for the names in `log`); whole numbers stay whole."""
    rng = random.Random(seed)
    points = []
    for _ in range(n):
        point = {}
        for name, values in space.items():
            if isinstance(values, tuple):
                low, high = values
                if name in log:
                    import math
                    drawn = math.exp(rng.uniform(math.log(low), math.log(high)))
                else:
                    drawn = rng.uniform(low, high)
                point[name] = round(drawn) if all(isinstance(v, int) for v in values) else drawn
            else:
                point[name] = rng.choice(values)
        points.append(point)
    return points


def parse_search(text):
    """``"grid"``, ``"random:N"`` or ``"optuna:N"`` -> ("grid", None), ("random", N) or
    ("optuna", N)."""
    kind, _, count = str(text or "grid").partition(":")
    if kind == "grid" and not count:
        return "grid", None
    if kind in ("random", "optuna") and count.isdigit() and int(count) > 0:
        return kind, int(count)
    raise UsageError(f"--search takes grid (every combination, the default), random:N (N points "
                     f"drawn from the values) or optuna:N (N trials asked of an Optuna study "
                     f"made here), not {text!r}.")


def points_of(space, search="grid", seed=None):
    """The trials' values; an Optuna search's are asked as each trial starts: {} each."""
    kind, count = parse_search(search)
    if kind == "optuna":
        return [{} for _ in range(count)]
    return grid(space) if kind == "grid" else random_points(space, count, seed)
