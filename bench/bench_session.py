"""A trivial cell on a warm session, round trip, beside the same cell on ipyparallel's ``%%px``.

The cell is ``1 + 1``, run through the real magics of one IPython shell: ``%%horovod --quiet``
on a warm hvd_magic session (driver-only ranks and, for --spark, a Spark barrier stage), and
``%%px`` on an ipyparallel cluster with the same number of engines. Repetitions alternate
between the two (the machine is shared and noisy); medians and best-of are reported, with the
ratio of hvd_magic's median to ``%%px``'s.

    .venv/bin/python bench/bench_session.py [--np 2 4] [--reps 50] [--spark] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import statistics
import time

from rows import row, write


def timed(fn, reps):
    for _ in range(3):  # warm-up
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--spark", action="store_true", help="also a session on Spark executors")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    os.environ["HVD_MAGIC_NO_WIDGETS"] = "1"
    import ipyparallel as ipp
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    rows = []
    for np in args.np:
        cluster = ipp.Cluster(n=np, log_level=40)
        client = cluster.start_and_connect_sync()
        client.wait_for_engines(np, timeout=120)
        client.activate()  # registers %%px in this shell
        placements = [("driver-only", -np)] + ([("spark", np)] if args.spark else [])
        try:
            for where, sign_np in placements:
                ip.run_line_magic("horovod_session", f"start --np {sign_np}")
                px, ours = [], []
                for _ in range(5):  # interleaved blocks
                    ours += timed(lambda: ip.run_cell_magic("horovod", "--quiet", "1 + 1"),
                                  args.reps // 5)
                    px += timed(lambda: ip.run_cell_magic("px", "--block", "1 + 1"),
                                args.reps // 5)
                ip.run_line_magic("horovod_session", "stop")
                for name, times in ((f"%%horovod in a session ({where})", ours),
                                    ("%%px (ipyparallel)", px)):
                    rows.append(row("session", name, np, times, ref=statistics.median(px),
                                    reps=len(times)))
                    print(f"np={np} {name}: median {rows[-1]['median'] * 1000:.1f} ms, best "
                          f"{rows[-1]['best'] * 1000:.1f} ms ({rows[-1]['ratio']:.2f}x %%px)",
                          flush=True)
        finally:
            cluster.stop_cluster_sync()
    write(args.json, rows)


if __name__ == "__main__":
    main()
