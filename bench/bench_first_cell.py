"""The first cell of a kernel: how long a ``%%horovod`` cell takes when it is the kernel's first,
with what `%load_ext` begins in the background (the embedded Spark session; the ranks' template
holding what the notebook imports) or not (``HVD_MAGIC_PRESTART=0``: the cell starts them),
typed at once after ``%load_ext`` or some seconds later (a person reading the next cell), beside
the same cell run again (warm). ``--np 2`` runs on Spark, ``--np -2`` on the driver; the cell
imports torch, as the notebook the kernel is told of does (``JPY_SESSION_NAME``).

Each repetition is a new kernel (a real one, as in JupyterLab); the cases are interleaved.

    .venv/bin/python bench/bench_first_cell.py [--reps 3] [--np 2 -2] [--after 0 10] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

from jupyter_client.manager import start_new_kernel

from rows import row, write

CELL = "%%horovod --np {np} --quiet\nimport os, torch\nos.getpid()\n"


def first_cell(np, prestart, after):
    """Seconds of the first run cell, `after` seconds after %load_ext returned, and of the same
    cell run again."""
    import nbformat
    env = dict(os.environ, HVD_MAGIC_PRESTART="1" if prestart else "0", HVD_MAGIC_NO_WIDGETS="1")
    cell = CELL.format(np=np)
    with tempfile.TemporaryDirectory() as cwd:
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [nbformat.v4.new_code_cell(c) for c in ("%load_ext hvd_magic", cell)]
        env["JPY_SESSION_NAME"] = os.path.join(cwd, "first.ipynb")
        nbformat.write(notebook, env["JPY_SESSION_NAME"])
        km, kc = start_new_kernel(kernel_name="python3", cwd=cwd, env=env)
        try:
            kc.execute_interactive("%load_ext hvd_magic", timeout=120)
            time.sleep(after)
            took = []
            for _ in range(2):
                start = time.monotonic()
                reply = kc.execute_interactive(cell, timeout=300, output_hook=lambda msg: None)
                took.append(time.monotonic() - start)
                assert reply["content"]["status"] == "ok", reply["content"]
            return took
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--np", type=int, nargs="+", default=[2, -2])
    parser.add_argument("--after", type=float, nargs="+", default=[0.0, 10.0])
    parser.add_argument("--json")
    args = parser.parse_args()
    cases = [(np, prestart, after) for np in args.np
             for prestart, after in [(False, 0.0)] + [(True, after) for after in args.after]]
    times = {case: [] for case in cases}
    warm = {np: [] for np in args.np}
    for rep in range(args.reps):
        for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:
            first, again = first_cell(*case)
            times[case].append(first)
            warm[case[0]].append(again)
            print(case, f"{first:.2f} s, again {again:.2f} s", file=sys.stderr)
    rows = []
    for (np, prestart, after), seconds in times.items():
        name = (f"--np {np}: begun at load, the cell {after:g} s later" if prestart
                else f"--np {np}: begun by the cell (HVD_MAGIC_PRESTART=0)")
        rows.append(row("first-cell", name, abs(np), seconds))
        print(f"{name}: median {statistics.median(seconds):.2f} s, best {min(seconds):.2f} s")
    for np, seconds in warm.items():
        name = f"--np {np}: the same cell again (warm)"
        rows.append(row("first-cell", name, abs(np), seconds))
        print(f"{name}: median {statistics.median(seconds):.2f} s, best {min(seconds):.2f} s")
    write(args.json, rows)


if __name__ == "__main__":
    main()
