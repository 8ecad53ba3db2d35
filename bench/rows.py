"""The one shape every benchmark writes with ``--json PATH``: a list of rows.

A row is a dict with at least

- ``bench``: which benchmark (``launch``, ``training``, ``payload``...);
- ``name``: what was measured (a launcher, a setting, a value size);
- ``np``: how many ranks (None where it does not apply);
- ``median`` and ``best``: of the repetitions (best is the lowest for times, the highest for
  rates: ``better`` says which);
- ``ratio``: the median over the median of that bench's reference row at the same np (the floor,
  horovodrun, the 8-byte value...), or None when there is no reference;

plus whatever else the benchmark wants to keep (``unit``, ``reps``, ``values``, its own columns).
`bench/run_all.py` builds BENCHMARKS.md from these rows alone.

Not for: timing anything; this only shapes and writes what the scripts measured.
"""

import json
import statistics


def row(bench, name, np, values, unit="s", better="lower", ref=None, **extra):
    """One row from the repetitions' values; `ref` is the reference's median (same bench, np)."""
    values = [v for v in values if v is not None]
    if not values:
        return dict(bench=bench, name=name, np=np, median=None, best=None, ratio=None, unit=unit,
                    better=better, values=[], **extra)
    median = statistics.median(values)
    best = min(values) if better == "lower" else max(values)
    return dict(bench=bench, name=name, np=np, median=median, best=best,
                ratio=median / ref if ref else None, unit=unit, better=better,
                values=list(values), **extra)


def rows_against(bench, table, reference, unit="s", better="lower", **extra):
    """Rows for `{name: {np: [values]}}`, each with its ratio to `reference`'s median at that np."""
    refs = {np: statistics.median(v) for np, v in table.get(reference, {}).items() if v}
    return [row(bench, name, np, values, unit, better, refs.get(np), reference=reference, **extra)
            for name, by_np in table.items() for np, values in by_np.items()]


def write(path, rows):
    """Write the rows where --json said (nothing when it was not given)."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def read(path):
    with open(path) as f:
        return json.load(f)
