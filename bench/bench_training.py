"""Training throughput: steps/s of a small MLP with hvd.DistributedOptimizer, hvd_magic vs horovodrun.

The same function trains a 64-256-256-10 MLP on one synthetic batch (32 rows) per step, on every
rank, for `--steps` steps after `--warmup` (inside the rank: start-up is not counted; every rank
starts the clock after a common allreduce). Its figure is rank 0's steps/s. Launchers, interleaved
per repetition:

- ``hvd_magic-spark`` / ``hvd_magic-driver``: ``hvd_magic.run(train, np=N)`` / ``np=-N``;
- ``horovodrun``: ``horovodrun --gloo -np N python bench/bench_training.py --child ...``, default
  knobs (its 0 ms cycle: DESIGN.md part 2);
- ``horovodrun-knobs``: the same with hvd_magic's knobs (``--cycle-time-ms 1 --cache-capacity 1024``),
  which tells the launcher's cost apart from the knobs'.

    .venv/bin/python bench/bench_training.py [--np 2 4] [--reps 3] [--steps 500] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile

from bench_launch import base_env, descendants, end_processes, leftovers, run_cmd, stop_spark

HERE = os.path.abspath(__file__)
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
LAUNCHERS = ("hvd_magic-spark", "hvd_magic-driver", "horovodrun", "horovodrun-knobs")


def train(steps, warmup):
    """One rank's training loop, timed; returns its steps/s and the CPU it used per step."""
    import resource
    import time
    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(hvd.rank())
    torch.set_num_threads(1)  # ranks share 2 cores: no intra-op threads fighting them
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    hvd.allreduce(torch.zeros(1), name="start")  # every rank starts the clock together
    cpu0, start = _cpu(resource), time.perf_counter()
    for _ in range(steps):
        step()
    wall, cpu = time.perf_counter() - start, _cpu(resource) - cpu0
    return {"rank": hvd.rank(), "steps_per_s": steps / wall, "cpu_ms_per_step": 1000 * cpu / steps}


def _cpu(resource):
    """CPU seconds of this process, all its threads (Horovod's background loop included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def under_hvd_magic(np, steps, warmup, run_root):
    import hvd_magic
    run = hvd_magic.run(train, np=np, args=(steps, warmup), run_dir=tempfile.mkdtemp(dir=run_root))
    return run.results[0]


def under_horovodrun(np, steps, warmup, *knobs):
    out = run_cmd([HOROVODRUN, "--gloo", "-np", str(np), *knobs, sys.executable, HERE,
                   "--child", str(steps), str(warmup)], env=base_env())
    results = [json.loads(m) for m in re.findall(r"BENCH (\{.*\})", out)]
    return next(r for r in results if r["rank"] == 0)


def measure(name, np, steps, warmup, run_root):
    if name == "hvd_magic-spark":
        return under_hvd_magic(np, steps, warmup, run_root)
    if name == "hvd_magic-driver":
        return under_hvd_magic(-np, steps, warmup, run_root)
    if name == "horovodrun":
        return under_horovodrun(np, steps, warmup)
    return under_horovodrun(np, steps, warmup, "--cycle-time-ms", "1", "--cache-capacity", "1024")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--child", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("BENCH " + json.dumps(train(*args.child)), flush=True)
        return

    run_root = tempfile.mkdtemp(prefix="bench_training-")
    before = set(descendants())
    rates = {n: {np: [] for np in args.np} for n in LAUNCHERS}
    cpu = {n: {np: [] for np in args.np} for n in LAUNCHERS}
    loads = [os.getloadavg()]
    try:
        print(f"warm-up (Spark session, first runs): np={min(args.np)}, 20 steps", flush=True)
        for name in LAUNCHERS:
            measure(name, min(args.np), 20, 5, run_root)
        for rep in range(args.reps):
            order = LAUNCHERS[rep % len(LAUNCHERS):] + LAUNCHERS[:rep % len(LAUNCHERS)]
            for np in args.np:
                for name in order:
                    rank0 = measure(name, np, args.steps, args.warmup, run_root)
                    rates[name][np].append(rank0["steps_per_s"])
                    cpu[name][np].append(rank0["cpu_ms_per_step"])
                    print(f"  rep {rep} np={np} {name:17s} {rank0['steps_per_s']:8.1f} steps/s, "
                          f"rank 0 CPU {rank0['cpu_ms_per_step']:.2f} ms/step", flush=True)
            loads.append(os.getloadavg())
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
        stop_spark()
        left = leftovers(before)
        if left:
            print(f"ending {len(left)} leftover processes: {[p.pid for p in left]}")
            end_processes(left)

    medians = {n: {np: statistics.median(v) for np, v in by_np.items()} for n, by_np in rates.items()}
    cpu_medians = {n: {np: statistics.median(v) for np, v in by_np.items()} for n, by_np in cpu.items()}
    print(f"\nrank 0 steps/s, median of {args.reps} ({args.steps} steps after {args.warmup}); "
          "ratio to horovodrun; min-max; rank 0 CPU ms/step")
    print(f"{'launcher':18s}" + "".join(f"{'np=' + str(np):>36s}" for np in args.np))
    for name in LAUNCHERS:
        cells = [f"{medians[name][np]:.1f} ({medians[name][np] / medians['horovodrun'][np]:.2f}x) "
                 f"{min(rates[name][np]):.0f}-{max(rates[name][np]):.0f} {cpu_medians[name][np]:.2f}"
                 for np in args.np]
        print(f"{name:18s}" + "".join(f"{c:>36s}" for c in cells))
    print(f"load average seen: {', '.join('%.1f' % la[0] for la in loads)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "reps": args.reps, "steps": args.steps, "warmup": args.warmup,
                       "rates": rates, "medians": medians, "cpu_ms_per_step": cpu,
                       "cpu_medians": cpu_medians, "loads": loads}, f, indent=1)


if __name__ == "__main__":
    main()
