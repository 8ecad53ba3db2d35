"""How long `pip install` of hvd_magic's wheel takes in a user's own environment (issue #49).

- ``into torch+pyspark``: a venv that already has torch and pyspark (made first, not timed);
  each repetition removes hvd_magic and its own dependencies again, then times
  ``pip install hvd_magic-*.whl`` (IPython, ipykernel, ipywidgets, pandas, pyarrow... from pip's
  cache or the registry). The first repetition is the one a new user sees.
- ``new venv [torch,spark]`` (with ``--fresh``): ``pip install hvd_magic-*.whl[torch,spark]`` into
  an empty venv: torch from the registry, as on a GPU machine (its CUDA build, ~6 GB).

    .venv/bin/python bench/bench_install.py [--reps 3] [--fresh] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

from rows import row, write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OWN_DEPENDENCIES = ["hvd_magic", "ipython", "ipykernel", "ipywidgets", "cloudpickle", "psutil",
                    "tqdm", "pandas", "pyarrow"]


def pip(python, *args):
    subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def timed(python, *args):
    start = time.perf_counter()
    pip(python, *args)
    return time.perf_counter() - start


def new_venv(folder):
    """A venv of the base Python (not of the one running this, which may be a venv itself)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", folder], check=True)
    return os.path.join(folder, "bin", "python")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="also the new venv (~6 GB, minutes)")
    parser.add_argument("--json")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-install-")
    try:
        pip(sys.executable, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", work,
            ROOT)
        wheel = glob.glob(os.path.join(work, "hvd_magic-*.whl"))[0]
        python = new_venv(os.path.join(work, "with-torch"))
        pip(python, "install", "--quiet", "torch==2.13.0", "pyspark")
        times = []
        for _ in range(args.reps):
            pip(python, "uninstall", "--yes", "--quiet", *OWN_DEPENDENCIES)
            times.append(timed(python, "install", "--quiet", wheel))
            print(f"into torch+pyspark: {times[-1]:.1f} s", flush=True)
        rows = [row("install", "into torch+pyspark", None, times, first=times[0])]
        if args.fresh:
            fresh = new_venv(os.path.join(work, "fresh"))
            seconds = timed(fresh, "install", "--quiet", f"{wheel}[torch,spark]")
            print(f"new venv [torch,spark]: {seconds:.1f} s", flush=True)
            rows.append(row("install", "new venv [torch,spark]", None, [seconds]))
        write(args.json, rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
