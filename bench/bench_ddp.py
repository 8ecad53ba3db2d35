"""torch.distributed (DDP) cells: training throughput beside torchrun, launch beside the floor and
beside PySpark's TorchDistributor.

Two measurements on N ranks of this machine, each repetition interleaved (the launchers' order
rotates from one repetition to the next):

- ``ddp-train``: rank 0's steps/s of one DDP training step (a 256-512-10 MLP, a batch of 64,
  Gloo), timed inside the rank between two barriers after a warm-up, under
  ``hvd_magic.run(train, np=-N)`` (``hvd_magic-driver``), ``np=N`` on Spark
  (``hvd_magic-spark``), and ``torchrun --nproc_per_node N`` running the same function as a
  script (``torchrun``, the reference). hvd_magic's ranks carry the hang watchdog's wrappers of
  ``backward`` and the collectives: their cost is in the figure.
- ``ddp-launch``: the wall time of the call that runs a trivial DDP cell
  (``init_process_group("gloo")`` and one ``all_reduce``: `bench_launch.torch_cell`), warm:
  ``hvd_magic-driver`` / ``hvd_magic-spark``, beside `bench_launch`'s ``floor`` (the reference:
  a trivial Horovod cell in N bare processes), ``floor-torch`` (the DDP cell in N bare
  processes) and TorchDistributor (``TD-local``: ``local_mode=True``; ``TD-barrier``:
  ``local_mode=False``).

    .venv/bin/python bench/bench_ddp.py [--np 1 2 4] [--train-np 2 4] [--reps 3]
                                        [--steps 200] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import bench_launch
from bench_launch import (base_env, floor, floor_torch, scratch_runs, spark_then,
                          torch_distributor)
from rows import rows_against, write

HERE = os.path.abspath(__file__)
WARMUP = 20


def train(steps, warmup=WARMUP, on_window=None):
    """Rank 0's steps/s of `steps` DDP steps (every rank returns its own); `on_window("start")`
    and `("end")` called at the timed steps' edges (bench_dscpu.py measures its CPU there)."""
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    start = None
    for i in range(warmup + steps):
        if i == warmup:  # every rank starts the clock together
            dist.barrier()
            if on_window:
                on_window("start")
            start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    dist.barrier()
    rate = steps / (time.perf_counter() - start)
    if on_window:
        on_window("end")
    dist.destroy_process_group()
    return rate


def child(steps):
    """A torchrun worker: the same function; rank 0 prints its rate."""
    rate = train(steps)
    if os.environ.get("RANK") == "0":
        print(f"RATE {rate}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # as hvd_magic's rank ends: no interpreter teardown with torch loaded


def torchrun_rate(np, steps, script=HERE, flag="--child", env=None):
    """Rank 0's rate printed by `script` run with `flag STEPS` under torchrun (also
    bench_jaxds.py's, for DeepSpeed)."""
    # (torchrun's module under this very Python: its script's own names a venv by another path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={np}", script, flag, str(steps)]
    out = subprocess.run(cmd, env=env or base_env(), capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"torchrun exited with {out.returncode}: {out.stderr[-500:]}")
    return float(next(line.split()[1] for line in out.stdout.splitlines()
                      if line.startswith("RATE ")))


def hvd_magic_call(fn, np, run_root, args=()):
    """(seconds of the call, rank 0's value)."""
    import hvd_magic
    from hvd_magic.view import TextView

    start = time.perf_counter()
    run = hvd_magic.run(fn, np=np, args=args, run_dir=tempfile.mkdtemp(dir=run_root),
                        view=TextView(quiet=True))
    return time.perf_counter() - start, run.results[0]


def trainers(run_root, steps, max_np):
    return {
        "torchrun": lambda np: torchrun_rate(np, steps),
        "hvd_magic-driver": lambda np: hvd_magic_call(train, -np, run_root, (steps,))[1],
        "hvd_magic-spark": spark_then(lambda np: hvd_magic_call(train, np, run_root, (steps,))[1],
                                      max_np),
    }


def launchers(run_root, max_np):
    cell = bench_launch.torch_cell
    return {
        "floor": floor,
        "floor-torch": floor_torch,
        "hvd_magic-driver": lambda np: hvd_magic_call(cell, -np, run_root)[0],
        "hvd_magic-spark": spark_then(lambda np: hvd_magic_call(cell, np, run_root)[0], max_np),
        "TD-local": spark_then(lambda np: torch_distributor(np, local_mode=True), max_np),
        "TD-barrier": spark_then(lambda np: torch_distributor(np, local_mode=False), max_np),
    }


def interleaved(table, nps, reps, label, fmt):
    """{name: {np: [values]}}: every entry once untimed at the smallest np, then `reps` rounds."""
    values = {name: {np: [] for np in nps} for name in table}
    for name, fn in table.items():
        fn(min(nps))  # warm-up (Spark's session, imports, caches)
    names = list(table)
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for np in nps:
            for name in order:
                try:
                    value = table[name](np)
                except Exception as exc:  # reported, the row keeps the other repetitions
                    print(f"  {label} rep {rep} np={np} {name}: FAILED {str(exc)[:300]}",
                          flush=True)
                    continue
                values[name][np].append(value)
                print(f"  {label} rep {rep} np={np} {name:17s} {fmt(value)}", flush=True)
    return values


def show(title, values, reference, unit):
    print(f"\n{title} (median; ratio to {reference})")
    for name, by_np in values.items():
        cells = []
        for np, vals in by_np.items():
            if not vals:
                cells.append(f"np={np}: –")
                continue
            ref = values[reference].get(np)
            ratio = statistics.median(vals) / statistics.median(ref) if ref else None
            cells.append(f"np={np}: {statistics.median(vals):7.2f} {unit}"
                         + (f" ({ratio:.2f}×)" if ratio else ""))
        print(f"  {name:17s} " + "   ".join(cells))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[1, 2, 4], help="launch: ranks")
    parser.add_argument("--train-np", type=int, nargs="+", default=[2, 4],
                        help="training: ranks")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child)

    import logging

    import cloudpickle
    cloudpickle.register_pickle_by_value(bench_launch)  # its torch_cell travels to the ranks
    # (TorchDistributor's generated script imports it by name)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
    logging.getLogger("TorchDistributor").setLevel(logging.WARNING)
    max_np = max(args.np + args.train_np)
    loads = [os.getloadavg()]
    with scratch_runs("bench_ddp-") as run_root:
        rates = interleaved(trainers(run_root, args.steps, max_np), args.train_np, args.reps,
                            "train", lambda v: f"{v:8.1f} steps/s")
        loads.append(os.getloadavg())
        times = interleaved(launchers(run_root, max_np), args.np, args.reps, "launch",
                            lambda v: f"{v:6.2f} s")
        loads.append(os.getloadavg())
    show("ddp-train: rank 0's steps/s", rates, "torchrun", "steps/s")
    show("ddp-launch: seconds of the call", times, "floor", "s")
    print(f"load averages (1, 5, 15 min) before, between, after: {loads}")
    write(args.json,
          rows_against("ddp-train", rates, "torchrun", unit="steps/s", better="higher",
                       reps=args.reps, steps=args.steps, loads=loads)
          + rows_against("ddp-launch", times, "floor", reps=args.reps, loads=loads))


if __name__ == "__main__":
    main()
