"""The first cell of a kernel: how long a ``%%horovod --np 2`` cell takes when it is the kernel's
first, with the embedded Spark session started when the extension loads (`prestart`) or not
(``HVD_MAGIC_PRESTART=0``: the cell starts it), typed at once after ``%load_ext`` or some
seconds later (a person reading the next cell).

Each repetition is a new kernel (a real one, as in JupyterLab); the cases are interleaved.

    .venv/bin/python bench/bench_first_cell.py [--reps 3] [--after 0 10] [--json PATH]

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

CELL = "%%horovod --np 2 --quiet\nimport os\nos.getpid()\n"


def first_cell(prestart, after):
    """Seconds of the first run cell, `after` seconds after %load_ext returned."""
    env = dict(os.environ, HVD_MAGIC_PRESTART="1" if prestart else "0", HVD_MAGIC_NO_WIDGETS="1")
    with tempfile.TemporaryDirectory() as cwd:
        km, kc = start_new_kernel(kernel_name="python3", cwd=cwd, env=env)
        try:
            kc.execute_interactive("%load_ext hvd_magic", timeout=120)
            time.sleep(after)
            start = time.monotonic()
            reply = kc.execute_interactive(CELL, timeout=300, output_hook=lambda msg: None)
            took = time.monotonic() - start
            assert reply["content"]["status"] == "ok", reply["content"]
            return took
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--after", type=float, nargs="+", default=[0.0, 10.0])
    parser.add_argument("--json")
    args = parser.parse_args()
    cases = [(False, 0.0)] + [(True, after) for after in args.after]
    times = {case: [] for case in cases}
    for rep in range(args.reps):
        for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:
            times[case].append(first_cell(*case))
            print(case, f"{times[case][-1]:.2f} s", file=sys.stderr)
    rows = []
    for (prestart, after), seconds in times.items():
        name = (f"Spark started at load, the cell {after:g} s later" if prestart
                else "Spark started by the cell (HVD_MAGIC_PRESTART=0)")
        rows.append(row("first-cell", name, 2, seconds))
        print(f"{name}: median {statistics.median(seconds):.2f} s, best {min(seconds):.2f} s")
    write(args.json, rows)


if __name__ == "__main__":
    main()
