"""What Horovod's timeline costs: steps/s of a small MLP trained with hvd.DistributedOptimizer.

Two driver-only ranks (``np=-2``: rank processes on this machine, no Spark, so Spark's start-up
and scheduling noise stay out of the numbers) run three settings, interleaved (off, dynamic,
full, off, dynamic, full, ...) so that drift in the machine's load hits all of them alike:

- ``off``:     HOROVOD_TIMELINE unset: plain Horovod, no timeline writer thread at all;
- ``dynamic``: HOROVOD_TIMELINE=DYNAMIC, never started: every hvd_magic run without --timeline
               (it lets ``with hvd_magic.timeline():`` record a window);
- ``full``:    ``--timeline``: rank 0 writes every event.

Each rank times `--steps` steps after `--warmup` steps (inside the rank: start-up not counted);
the figures are rank 0's steps/s, the CPU seconds rank 0's process used per second of that loop,
and per second of `--idle` seconds of sleep afterwards (a spinning writer thread shows there,
whatever else the machine is doing). Medians over `--reps` runs; steps/s also as a ratio to
``off``.

The interpreter decides which Horovod is measured (the ranks are started with it too):

    .venv/bin/python bench/bench_timeline.py                 # patched (*no-spin*.patch)
    /tmp/stock-venv/bin/python bench/bench_timeline.py       # stock Horovod, built by
                                                             # scripts/build_horovod.sh VENV stock

Not a test: timings belong here, not in tests/.
"""

import argparse
import os
import statistics
import sys
import tempfile

import cloudpickle

import bench_training
import hvd_magic
from bench_training import timed_steps
from rows import row, write

SETTINGS = ("off", "dynamic", "full")


def train(setting, steps, warmup, idle):
    """One rank: the training loop, timed. Runs on the ranks (pickled by value from __main__)."""
    import os
    import resource
    import time

    if setting == "off":
        os.environ.pop("HOROVOD_TIMELINE", None)  # read by hvd.init(), so still in time here
    import torch
    import horovod.torch as hvd

    hvd.init()
    wall, cpu = timed_steps(hvd, steps, warmup)
    # Then idle, as a notebook's ranks are between collectives: what does the process burn?
    idle0 = _cpu(resource)
    time.sleep(idle)
    idle_cpu = _cpu(resource) - idle0
    hvd.allreduce(torch.zeros(1), name="end")  # nobody shuts down while another still measures
    return {"steps_per_s": steps / wall, "cpu_per_s": cpu / wall, "idle_cpu_per_s": idle_cpu / idle}


def _cpu(resource):
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def horovod_build():
    """Which Horovod this interpreter has: scripts/build_horovod.sh leaves the wheel's key."""
    try:
        with open(os.path.join(sys.prefix, ".horovod-key")) as f:
            return os.path.basename(f.read().strip())
    except OSError:
        return "unknown build"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="runs per setting")
    parser.add_argument("--steps", type=int, default=500, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--idle", type=float, default=1.0,
                        help="seconds each rank then sleeps, to measure what idling costs")
    parser.add_argument("--json", help="write the rows here (bench/rows.py)")
    args = parser.parse_args()

    print(f"python {sys.executable}\nhorovod {horovod_build()}")
    print(f"2 driver-only ranks (np=-2), {args.steps} steps after {args.warmup}, "
          f"{args.reps} runs per setting, interleaved")
    results = {s: [] for s in SETTINGS}
    cloudpickle.register_pickle_by_value(bench_training)  # the ranks cannot import bench/
    with tempfile.TemporaryDirectory(prefix="bench-timeline-") as tmp:
        for rep in range(args.reps):
            for setting in SETTINGS:
                run = hvd_magic.run(train, np=-2,
                                    args=(setting, args.steps, args.warmup, args.idle),
                                    timeline=setting == "full",
                                    # DYNAMIC whether or not hvd_magic would choose it for `train`
                                    env={"HOROVOD_TIMELINE": "DYNAMIC"} if setting == "dynamic" else None,
                                    run_dir=os.path.join(tmp, f"{setting}-{rep}"))
                rank0 = run.results[0]
                results[setting].append(rank0)
                print(f"  rep {rep} {setting:8s} {rank0['steps_per_s']:8.1f} steps/s  "
                      f"rank 0 CPU {rank0['cpu_per_s']:.2f} s/s, idle "
                      f"{rank0['idle_cpu_per_s']:.2f} s/s", flush=True)

    base = statistics.median(r["steps_per_s"] for r in results["off"])
    print(f"\n{'setting':8s} {'median steps/s':>15s} {'min':>8s} {'max':>8s} {'vs off':>7s} "
          f"{'rank 0 CPU s/s':>15s} {'idle CPU s/s':>13s}")
    rows = []
    for setting in SETTINGS:
        rates = [r["steps_per_s"] for r in results[setting]]
        cpu = statistics.median(r["cpu_per_s"] for r in results[setting])
        idle = statistics.median(r["idle_cpu_per_s"] for r in results[setting])
        median = statistics.median(rates)
        print(f"{setting:8s} {median:15.1f} {min(rates):8.1f} {max(rates):8.1f} "
              f"{median / base:7.2f} {cpu:15.2f} {idle:13.2f}")
        rows.append(row("timeline", setting, 2, rates, unit="steps/s", better="higher", ref=base,
                        cpu_per_s=cpu, idle_cpu_per_s=idle, steps=args.steps, reps=args.reps))
    write(args.json, rows)


if __name__ == "__main__":
    main()
