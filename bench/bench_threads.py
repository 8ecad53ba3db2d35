"""CPU threads per rank (issue #43): a small CNN's images/s under each launcher, default threads.

The script is this file with ``--child``, written in the style of Horovod's
``examples/pytorch/pytorch_synthetic_benchmark.py`` (our own, smaller): a 3-layer CNN on synthetic
32×32 images, batch 32, SGD under ``hvd.DistributedOptimizer``; `--warmup` batches, then
`--iters` iterations of `--batches` batches, each timed; the figure is Horovod's "total img/sec":
rank 0's mean images/s per iteration × the number of ranks. Nothing in it sets a thread count:
each launcher's defaults decide, which is what is measured.

- ``hvd-run-spark``: ``hvd-run --np N script.py`` (an embedded local Spark session it starts);
- ``hvd-run-driver``: ``hvd-run --np -N script.py`` (N processes, no Spark);
- ``horovodrun``: ``horovodrun --gloo -np N python script.py`` (torch's default: every core per
  rank).

Launchers alternate within each repetition, in an order that rotates. Every launch starts
from nothing (hvd-run its own Spark JVM), so a repetition is 9 launches: after `--budget`
seconds no further repetition begins (the rows say how many ran). Goal: ≥ 1.5× horovodrun where
ranks × torch's default threads exceed the cores (np 2 and 4 on 2 cores), never below it at np 1.

    .venv/bin/python bench/bench_threads.py [--np 1 2 4] [--reps 3] [--budget 330] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.dirname(sys.executable)
LAUNCHERS = ("hvd-run-spark", "hvd-run-driver", "horovodrun")


def synthetic(warmup, iters, batches):
    """One rank's benchmark; rank 0 returns Horovod's total img/s and its thread count."""
    import time
    import torch
    import torch.nn.functional as F
    import horovod.torch as hvd
    from torch import nn

    hvd.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data, target = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def batch():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(warmup):
        batch()
    rates = []
    for _ in range(iters):
        start = time.perf_counter()
        for _ in range(batches):
            batch()
        rates.append(32 * batches / (time.perf_counter() - start))
    return {"rank": hvd.rank(), "img_per_s": statistics.mean(rates) * hvd.size(),
            "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}


def measure(name, np, warmup, iters, batches):
    """Rank 0's result under launcher `name` with `np` ranks."""
    from bench_launch import base_env, run_cmd
    child = [HERE, "--child", str(warmup), str(iters), str(batches)]
    env = dict(base_env(), PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    if name == "horovodrun":
        cmd = [os.path.join(BIN, "horovodrun"), "--gloo", "-np", str(np), sys.executable, *child]
    else:
        cmd = [os.path.join(BIN, "hvd-run"), "--np", str(np if name == "hvd-run-spark" else -np),
               "--run-root", os.path.join(os.environ.get("TMPDIR", "/tmp"), "bench_threads-runs"),
               *child]
    out = run_cmd(cmd, env=env)
    _wait_for_jvm_exit()
    results = [json.loads(m) for m in re.findall(r"BENCH (\{.*\})", out)]
    return next(r for r in results if r["rank"] == 0)


def _wait_for_jvm_exit(limit=20.0):
    """hvd-run's Spark JVM ends a moment after hvd-run itself: the next launch must not share the
    cores with it (it is known by our tree's log4j file on its command line)."""
    import psutil
    mark = os.path.join(ROOT, "hvd_magic")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not any(any(mark in arg for arg in (p.info["cmdline"] or []))
                   for p in psutil.process_iter(["cmdline"])):
            return
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--budget", type=float, default=330.0,
                        help="seconds after which no further repetition begins")
    parser.add_argument("--only", nargs="+", default=list(LAUNCHERS), choices=LAUNCHERS)
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("BENCH " + json.dumps(synthetic(*args.child)), flush=True)
        return
    from bench_launch import descendants, end_processes, leftovers
    from rows import rows_against, write

    launchers = tuple(args.only)
    before = set(descendants())
    rates = {n: {np: [] for np in args.np} for n in launchers}
    threads = {n: {} for n in launchers}
    loads = [os.getloadavg()]
    print(f"{len(os.sched_getaffinity(0))} cores; img/s (Horovod's total), rank 0's torch threads",
          flush=True)
    began, reps = time.monotonic(), 0
    try:
        for rep in range(args.reps):
            if rep and time.monotonic() - began > args.budget * rep / (rep + 1):
                print(f"  (the budget of {args.budget:g} s allows no further repetition)")
                break  # one more, as long as the last ones took, would pass the budget
            reps = rep + 1
            order = launchers[rep % len(launchers):] + launchers[:rep % len(launchers)]
            for np in args.np:
                for name in order:
                    rank0 = measure(name, np, args.warmup, args.iters, args.batches)
                    rates[name][np].append(rank0["img_per_s"])
                    threads[name][np] = rank0["threads"]
                    print(f"  rep {rep} np={np} {name:15s} {rank0['img_per_s']:8.1f} img/s, "
                          f"{rank0['threads']} threads (OMP_NUM_THREADS={rank0['omp']})",
                          flush=True)
            loads.append(os.getloadavg())
    finally:
        left = leftovers(before)
        if left:
            print(f"ending {len(left)} leftover processes: {[p.pid for p in left]}")
            end_processes(left)
    print(f"\nimg/s, median of {reps} (best); ratio to horovodrun's median")
    for name in launchers:
        ref = rates.get("horovodrun", rates[name])
        print(f"{name:15s}" + "".join(
            f"   np={np}: {statistics.median(v):6.1f} ({max(v):.0f}) "
            f"{statistics.median(v) / statistics.median(ref[np]):.2f}×"
            for np, v in rates[name].items()))
    print(f"load average seen: {', '.join('%.1f' % la[0] for la in loads)}")
    rows = rows_against("threads", rates, "horovodrun", unit="img/s", better="higher",
                        reps=reps, iters=args.iters, batches=args.batches,
                        loads=[round(la[0], 2) for la in loads])
    for r in rows:
        r["threads"] = threads[r["name"]].get(r["np"])
    write(args.json, rows)


if __name__ == "__main__":
    main()
