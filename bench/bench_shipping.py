"""What sending the notebook's packages to a cluster's executors costs (#65): a cell that imports
pandas on a standalone cluster of two workers (tests/conftest.py's), its first run on a new
session and its second, where the executors' Python

- lacks hvd_magic, cloudpickle, psutil, pandas and what pandas requires (numpy, dateutil, pytz,
  tzdata, six): the first run sends them all (the zips already packed on this machine, as after
  any earlier run) and each executor unpacks them once (its cache emptied before each first run);
- has all of them installed (hvd_magic from the project's wheel), the reference.

Also: packing those zips the first time on a machine (`shipping.pack`, into an empty cache).
The cases are interleaved, repetition by repetition; the wall time of the cell's call is measured.

    .venv/bin/python bench/bench_shipping.py [--reps 3] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # StandaloneCluster, own_env

from rows import row, write  # noqa: E402

CELL = "import pandas\npandas.DataFrame({'a': [1, 2]}).a.sum().item()"
LACKING = ("horovod", "cloudpickle", "psutil", "pandas", "numpy", "python_dateutil", "dateutil",
           "pytz", "tzdata", "six")


def timed_cell(ip):
    start = time.perf_counter()
    value = ip.run_cell_magic("horovod", "--np 4 --quiet", CELL)
    assert value == 3, value
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    os.environ["HVD_MAGIC_NO_WIDGETS"] = "1"
    from IPython.testing.globalipapp import start_ipython

    from conftest import StandaloneCluster
    from own_env import build_wheel, make_env
    import importlib.metadata as metadata
    from hvd_magic.launch import shipping
    from hvd_magic.task.shipped import cache_root

    tmp = tempfile.mkdtemp(prefix="bench_shipping-")
    envs = {"lacking": make_env(os.path.join(tmp, "lacking"), None, LACKING),
            "installed": make_env(os.path.join(tmp, "installed"), build_wheel(tmp))}
    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    cluster = StandaloneCluster(tmp).start()
    times = {f"{n}, {k} run": [] for n in envs for k in ("first", "second")}
    packing = []
    try:
        for rep in range(args.reps):
            for name, python in envs.items():
                shutil.rmtree(cache_root(), ignore_errors=True)  # the executors' (this machine)
                session = cluster.session(python=python)
                try:
                    times[f"{name}, first run"].append(timed_cell(ip))
                    times[f"{name}, second run"].append(timed_cell(ip))
                finally:
                    session.stop()
            folder = tempfile.mkdtemp(prefix="packed-", dir=tmp)
            before, shipping.cache_folder = shipping.cache_folder, lambda: folder
            shipping._packed.clear()
            start = time.perf_counter()
            parcels = [shipping.pack(d)[0] for d in shipping.chosen(["pandas"])]
            packing.append(time.perf_counter() - start)
            shipping.cache_folder = before
            shipping._packed.clear()
            mb = sum(p.size for p in parcels) / 1e6
            print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items())
                  + f"; packing {packing[-1]:.2f} s ({mb:.0f} MB)", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ref = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    rows = [row("shipping", name, 4, values,
                ref=ref["installed, " + name.split(", ")[1]], reference="installed, same run",
                mb=round(mb, 1))
            for name, values in times.items()]
    rows.append(row("shipping", f"packing pandas and its requirements ({mb:.0f} MB), first time "
                    f"on a machine", None, packing, mb=round(mb, 1)))
    print(f"pandas's parcels here: {[d.metadata['Name'] for d in shipping.chosen(['pandas'])]}"
          f" ({metadata.version('pandas')})")
    for r in rows:
        print(f"{r['name']:<60} median {r['median']:.2f} s  best {r['best']:.2f} s"
              + (f"  ratio {r['ratio']:.2f}" if r["ratio"] else ""))
    write(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
