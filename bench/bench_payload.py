"""Payload: what a large notebook value costs a ``%%horovod`` cell (time, and driver memory).

A real IPython shell (`IPython.testing.globalipapp`) with the extension loaded holds ``arr``, a
float64 numpy array of 10, 100 or 200 MB, and runs::

    %%horovod --np 4 --quiet --text      (--np N)
    import time
    (time.time(), float(arr[-1]), arr.nbytes)

on an embedded Spark session (values above 4 MB travel by Spark broadcast). Per size, medians of
`--reps` interleaved runs of:

- ``driver``: from the magic's call until the run started (cell captured, values pickled, large
  ones broadcast: `Run.started`);
- ``to rank``: from the call until the cell began on rank 0 (capture + ship + launch + unpickle);
- ``cell``: the whole magic call;
- ``extra``: ``to rank`` minus the same for an 8-byte array (the launch itself);
- ``peak RSS``: the driver's resident memory high-water mark during the call, above its level
  before (sampled every 5 ms), and, in one more run per size, ``tracemalloc``'s peak of Python
  allocations (numpy's included) during the call.

    .venv/bin/python bench/bench_payload.py [--mb 10 100 200] [--reps 3] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import statistics
import threading
import time
import tracemalloc

from bench_launch import scratch_runs
from rows import row as make_row, write

CELL = "import time\n(time.time(), float(arr[-1]), arr.nbytes)\n"
MB = 1024 * 1024


class PeakRSS:
    """The highest resident set size of this process while in the `with` block, in bytes."""

    def __init__(self, interval=0.005):
        import psutil
        self.process = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self):
        self.before = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def one_cell(ip, size_bytes, np, traced=False):
    import numpy
    import hvd_magic

    ip.user_ns["arr"] = numpy.ones(max(1, size_bytes // 8), dtype=numpy.float64)
    if traced:
        tracemalloc.start()
        tracemalloc.reset_peak()
    with PeakRSS() as rss:
        t0 = time.time()
        began, last, nbytes = ip.run_cell_magic("horovod", f"--np {np} --quiet --text", CELL)
        t1 = time.time()
    traced_peak = None
    if traced:
        traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    del ip.user_ns["arr"]
    assert last == 1.0 and nbytes == max(1, size_bytes // 8) * 8
    run = hvd_magic.last_run()
    return {"driver": run.started - t0, "to_rank": began - t0, "cell": t1 - t0,
            "rss_peak": rss.peak - rss.before, "traced_peak": traced_peak,
            "broadcast": list(run.broadcast_names)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[10, 100, 200])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--np", type=int, default=4, help="ranks (Spark tasks) of each cell")
    parser.add_argument("--json", help="write the rows here (bench/rows.py)")
    args = parser.parse_args()

    from IPython.testing.globalipapp import start_ipython

    sizes = [0] + [mb * MB for mb in args.mb]  # 0: the 8-byte baseline
    results = {s: [] for s in sizes}
    traced = {}
    here = os.getcwd()
    loads = [os.getloadavg()]
    with scratch_runs("bench_payload-") as work:
        os.chdir(work)  # the magic's run folders (hvd_runs/) go here, and are removed with it
        try:
            ip = start_ipython()
            ip.run_line_magic("load_ext", "hvd_magic")
            print("warm-up: the Spark session and a first cell", flush=True)
            one_cell(ip, 0, args.np)
            for rep in range(args.reps):
                order = sizes[rep % len(sizes):] + sizes[:rep % len(sizes)]
                for size in order:
                    r = one_cell(ip, size, args.np)
                    results[size].append(r)
                    print(f"  rep {rep} {size // MB:4d} MB: driver {r['driver']:.2f} s, to rank "
                          f"{r['to_rank']:.2f} s, cell {r['cell']:.2f} s, peak RSS "
                          f"+{r['rss_peak'] / MB:.0f} MB", flush=True)
                loads.append(os.getloadavg())
            for size in sizes:
                traced[size] = one_cell(ip, size, args.np, traced=True)["traced_peak"]
        finally:
            os.chdir(here)

    def med(size, key):
        return statistics.median(r[key] for r in results[size])

    base = med(0, "to_rank")
    rows = []
    print(f"\nnp={args.np} on embedded Spark, median of {args.reps}")
    print(f"{'value':>8s} {'driver s':>9s} {'to rank s':>10s} {'extra s':>8s} {'cell s':>7s} "
          f"{'peak RSS MB':>12s} {'tracemalloc MB':>15s}")
    for size in sizes:
        row = {"mb": size / MB, "driver": med(size, "driver"), "to_rank": med(size, "to_rank"),
               "extra": med(size, "to_rank") - base, "cell": med(size, "cell"),
               "rss_peak_mb": med(size, "rss_peak") / MB, "traced_peak_mb": traced[size] / MB,
               "broadcast": bool(results[size][0]["broadcast"])}
        rows.append(row)
        label = "8 B" if size == 0 else f"{size // MB} MB"
        print(f"{label:>8s} {row['driver']:9.2f} {row['to_rank']:10.2f} {row['extra']:8.2f} "
              f"{row['cell']:7.2f} {row['rss_peak_mb']:12.0f} {row['traced_peak_mb']:15.0f}")
    print(f"load average seen: {', '.join('%.1f' % la[0] for la in loads)}")
    out = []
    for size, r in zip(sizes, rows):
        label = "8 B" if size == 0 else f"{size // MB} MB"
        out.append(make_row("payload", label, args.np, [x["to_rank"] for x in results[size]],
                            ref=base, reference="8 B", extra=r["extra"], driver=r["driver"],
                            cell=r["cell"], rss_peak_mb=r["rss_peak_mb"],
                            traced_peak_mb=r["traced_peak_mb"], broadcast=r["broadcast"],
                            mb=r["mb"], reps=args.reps, loads=[round(la[0], 2) for la in loads]))
    write(args.json, out)


if __name__ == "__main__":
    main()
