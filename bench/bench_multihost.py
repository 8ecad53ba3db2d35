"""Launch across hosts: the trivial cell of bench_launch.py from np 1 to 16 on four simulated hosts.

The hosts are tests/simhosts.py's: the root network namespace and three namespaces on one bridge,
each running one Spark standalone worker of 4 cores (16 slots in all; master and driver in the
root namespace). Rows, interleaved per repetition:

- ``floor``: bench_launch.py's floor on this machine (N bare rank processes, Horovod's env by
  hand, one host): what the work itself costs, wherever it runs;
- ``spark-empty-job-4hosts``: a barrier stage of N tasks that do nothing, on the cluster;
- ``hvd_magic-4hosts``: ``hvd_magic.run(cell, np=N)`` on the cluster: its ranks spread over the
  hosts as Spark places the tasks (each row says how many ranks each host got).

The cluster is started once, before any timing, and every launcher runs once untimed at the
largest np (so every executor has its Python workers, as on a cluster in use). It needs
root (network namespaces); everything it makes is removed at the end, also on failure.

    .venv/bin/python bench/bench_multihost.py [--np 1 2 4 8 16] [--reps 2] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # simhosts, StandaloneCluster

import bench_launch  # noqa: E402
from rows import rows_against, write  # noqa: E402

HOSTS, SLOTS = 4, 4


def _empty_task(iterator):
    yield 0


def spark_empty(session, np):
    start = time.perf_counter()
    session.sparkContext.parallelize(range(np), np).barrier().mapPartitions(_empty_task).collect()
    return time.perf_counter() - start


def hvd_magic_4hosts(np, run_root, placements):
    seconds, run = bench_launch.hvd_magic_run(np, run_root)
    per_host = collections.Counter(r.executor.rsplit(":", 1)[0] for r in run.ranks)
    placements[np].append(sorted(per_host.values(), reverse=True))
    return seconds


def measure(args, session, run_root):
    placements = collections.defaultdict(list)
    table = {
        "floor": bench_launch.floor,
        "spark-empty-job-4hosts": lambda np: spark_empty(session, np),
        "hvd_magic-4hosts": lambda np: hvd_magic_4hosts(np, run_root, placements),
    }
    times = {n: {np: [] for np in args.np} for n in table}
    loads = [os.getloadavg()]
    # warm-up at the largest np: every executor's Python workers started (a first task on an
    # executor pays for them: +6 s at np 2 in a trial), as a cluster in use has them
    print(f"warm-up: each launcher once at np={max(args.np)}", flush=True)
    for fn in table.values():
        fn(max(args.np))
    placements.clear()
    names = list(table)
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for np in args.np:
            for name in order:
                seconds = table[name](np)
                times[name][np].append(seconds)
                print(f"  rep {rep} np={np:2d} {name:24s} {seconds:6.2f} s", flush=True)
        loads.append(os.getloadavg())
    return times, placements, loads


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    if max(args.np) > HOSTS * SLOTS:
        parser.error(f"--np at most {HOSTS * SLOTS} (4 hosts of {SLOTS} slots)")

    import simhosts
    from conftest import StandaloneCluster
    why = simhosts.unavailable()
    if why:
        print(f"skipped: {why}")
        write(args.json, [{"bench": "launch-4hosts", "name": "all", "np": None, "median": None,
                           "best": None, "ratio": None, "error": why}])
        return 0
    tmp = tempfile.mkdtemp(prefix="bench_multihost-")
    before = set(bench_launch.descendants())
    try:
        with simhosts.simulated_hosts(HOSTS) as hosts:
            start = time.perf_counter()
            cluster = StandaloneCluster(
                tmp, worker_hosts=[h.address for h in hosts], cores=SLOTS,
                master_host=hosts[0].address,
                worker_prefixes={i: h.prefix for i, h in enumerate(hosts) if h.netns}).start()
            try:
                session = cluster.session()
                print(f"cluster of {HOSTS} hosts up in {time.perf_counter() - start:.1f} s",
                      flush=True)
                times, placements, loads = measure(args, session, tmp)
            finally:
                cluster.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        left = bench_launch.leftovers(before)
        if left:
            print(f"ending {len(left)} leftover processes")
            bench_launch.end_processes(left)

    floor = {np: statistics.median(v) for np, v in times["floor"].items()}
    print(f"\nlaunch on {HOSTS} hosts, median seconds of {args.reps} (ratio to floor)")
    print(f"{'launcher':24s}" + "".join(f"{'np=' + str(np):>15s}" for np in args.np))
    for name, by_np in times.items():
        cells = [f"{statistics.median(by_np[np]):.2f} ({statistics.median(by_np[np]) / floor[np]:.2f}x)"
                 for np in args.np]
        print(f"{name:24s}" + "".join(f"{c:>15s}" for c in cells))
    print("ranks per host (hvd_magic-4hosts): "
          + ", ".join(f"np={np}: {placements[np]}" for np in args.np))
    print(f"load average seen: {', '.join('%.1f' % la[0] for la in loads)}")
    rows = rows_against("launch-4hosts", times, "floor", reps=args.reps,
                        loads=[round(la[0], 2) for la in loads])
    for r in rows:
        if r["name"] == "hvd_magic-4hosts":
            seen = {"+".join(map(str, p)) for p in placements[r["np"]]}
            r["ranks_per_host"] = " / ".join(sorted(seen))
    write(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
