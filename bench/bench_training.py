"""Training throughput: steps/s of a small MLP with hvd.DistributedOptimizer, hvd_magic vs horovodrun.

The same function trains a 64-256-256-10 MLP (PyTorch, or tf.keras with ``--frameworks keras``) on one synthetic batch (32 rows) per step, on every
rank, for `--steps` steps after `--warmup` (inside the rank: start-up is not counted; every rank
starts the clock after a common allreduce). Its figure is rank 0's steps/s. Launchers, interleaved
per repetition:

- ``hvd_magic-spark`` / ``hvd_magic-driver``: ``hvd_magic.run(train, np=N)`` / ``np=-N``;
- ``horovodrun``: ``horovodrun --gloo -np N python bench/bench_training.py --child ...``, default
  knobs (its 0 ms cycle: DESIGN.md part 2);
- ``horovodrun-knobs``: the same with hvd_magic's knobs (``--cycle-time-ms 1 --cache-capacity 1024``),
  which tells the launcher's cost apart from the knobs'.

    .venv/bin/python bench/bench_training.py [--np 2 4] [--reps 3] [--steps 500]
        [--frameworks torch keras] [--only LAUNCHER ...] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile

from bench_launch import base_env, run_cmd, scratch_runs
from rows import rows_against, write

HERE = os.path.abspath(__file__)
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
LAUNCHERS = ("hvd_magic-spark", "hvd_magic-driver", "horovodrun", "horovodrun-knobs")


def train(steps, warmup, dynamic=True):
    """One rank's training loop, timed; returns its steps/s and the CPU it used per step."""
    import os
    import horovod.torch as hvd

    # (Its names avoid the word for Horovod's trace: hvd_magic turns its DYNAMIC mode on for a
    # job that names it.) An experiment: HOROVOD_*=DYNAMIC removed (read by hvd.init()).
    if not dynamic:
        os.environ.pop("HOROVOD_TIMELINE", None)
    hvd.init()
    wall, cpu = timed_steps(hvd, steps, warmup)
    return {"rank": hvd.rank(), "steps_per_s": steps / wall, "cpu_ms_per_step": 1000 * cpu / steps}


def timed_steps(hvd, steps, warmup):
    """On a rank of horovod.torch (`hvd`, initialised): a small MLP trained with Horovod's
    DistributedOptimizer, `warmup` steps, then `steps` timed from a start every rank shares;
    (wall seconds, CPU seconds of this process) of those."""
    import resource
    import time
    import torch

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
    return time.perf_counter() - start, _cpu(resource) - cpu0


def train_keras(steps, warmup, dynamic=True):
    """The same MLP, batch and loop with tf.keras (Keras 2) and horovod.tensorflow.keras."""
    import os
    import resource
    import time
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow as htf
    import horovod.tensorflow.keras as hvd

    # One thread each, as the torch loop's set_num_threads(1): ranks share the cores.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if not dynamic:
        os.environ.pop("HOROVOD_TIMELINE", None)
    hvd.init()
    tf.random.set_seed(hvd.rank())
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.standard_normal((32, 64), dtype=np.float32), rng.integers(0, 10, 32)
    model.train_on_batch(x, y)
    htf.broadcast_variables(model.variables, root_rank=0)
    for _ in range(warmup):
        model.train_on_batch(x, y)
    htf.allreduce(tf.zeros(1), name="start")  # every rank starts the clock together
    cpu0, start = _cpu(resource), time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    wall, cpu = time.perf_counter() - start, _cpu(resource) - cpu0
    return {"rank": hvd.rank(), "steps_per_s": steps / wall, "cpu_ms_per_step": 1000 * cpu / steps}


TRAIN = {"torch": train, "keras": train_keras}


def cost_of(bench, switch, on, off, reps, steps, warmup=50):
    """What a feature of ours costs training: rank 0's steps/s of `train` at np 2 (the driver's
    launcher) with the feature (`on`) and without (`off`: the bench switch `switch`=1 in the
    notebook's environment for that run), interleaved. Rows for `bench`, the first with the
    median of each back-to-back pair's ratio, which shrugs off the load's drift."""
    import cloudpickle
    import hvd_magic
    from hvd_magic.view.text import TextView

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import bench/
    table = {on: {2: []}, off: {2: []}}
    for rep in range(reps):
        # alternate which goes first: neither always meets the machine's load first
        for name in ((on, off) if rep % 2 == 0 else (off, on)):
            if name == off:
                os.environ[switch] = "1"  # read by the driver's tasks, inherited by its ranks
            try:
                run = hvd_magic.run(train, np=-2, args=(steps, warmup), view=TextView(quiet=True))
            finally:
                os.environ.pop(switch, None)
            table[name][2].append(run.results[0]["steps_per_s"])
            print(f"rep {rep} {name}: {table[name][2][-1]:.1f} steps/s", flush=True)
    rows = rows_against(bench, table, off, unit="steps/s", better="higher", reps=reps, steps=steps)
    rows[0]["paired_ratio"] = statistics.median(a / b for a, b in zip(table[on][2], table[off][2]))
    return rows


def _cpu(resource):
    """CPU seconds of this process, all its threads (Horovod's background loop included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def under_hvd_magic(fw, np, steps, warmup, run_root, horovod_env=None, dynamic=True, env=None):
    import hvd_magic
    run = hvd_magic.run(TRAIN[fw], np=np, args=(steps, warmup, dynamic), horovod_env=horovod_env,
                        env=env,
                        run_dir=tempfile.mkdtemp(dir=run_root))
    return run.results[0]


def under_horovodrun(fw, np, steps, warmup, *knobs):
    # Keras 2 and quiet TensorFlow, as every hvd_magic rank gets (driver/run.py DEFAULT_RANK_ENV).
    env = dict(base_env(), TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    out = run_cmd([HOROVODRUN, "--gloo", "-np", str(np), *knobs, sys.executable, HERE,
                   "--child", fw, str(steps), str(warmup)], env=env)
    results = [json.loads(m) for m in re.findall(r"BENCH (\{.*\})", out)]
    return next(r for r in results if r["rank"] == 0)


def measure(name, fw, np, steps, warmup, run_root):
    if ":" in name:  # an experiment: "LAUNCHER:MS[:notl|:dyn][:nocache]", HOROVOD_CYCLE_TIME=MS,
        # no Horovod timeline configured (notl) or HOROVOD_TIMELINE=DYNAMIC (dyn, the old
        # default), response cache off (nocache)
        base, cycle, *flags = name.split(":")
        knobs = {"HOROVOD_CYCLE_TIME": cycle}
        if "nocache" in flags:  # as horovodrun's '(None,)' does: strtol gives 0, no cache
            knobs["HOROVOD_CACHE_CAPACITY"] = "0"
        return under_hvd_magic(fw, np if base == "hvd_magic-spark" else -np, steps, warmup,
                               run_root, horovod_env=knobs,
                               dynamic="notl" not in flags,
                               env={"HOROVOD_TIMELINE": "DYNAMIC"} if "dyn" in flags else None)
    if name == "hvd_magic-spark":
        return under_hvd_magic(fw, np, steps, warmup, run_root)
    if name == "hvd_magic-driver":
        return under_hvd_magic(fw, -np, steps, warmup, run_root)
    if name == "horovodrun":
        return under_horovodrun(fw, np, steps, warmup)
    return under_horovodrun(fw, np, steps, warmup, "--cycle-time-ms", "1", "--cache-capacity", "1024")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--frameworks", nargs="+", choices=list(TRAIN), default=["torch"])
    parser.add_argument("--only", nargs="+", default=list(LAUNCHERS),
                        help=f"of {', '.join(LAUNCHERS)}; or LAUNCHER:MS[:notl|:dyn][:nocache], "
                             f"hvd_magic with that HOROVOD_CYCLE_TIME (without, with a DYNAMIC "
                             f"timeline; no response cache)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fw, steps, warmup = args.child
        print("BENCH " + json.dumps(TRAIN[fw](int(steps), int(warmup))), flush=True)
        return
    launchers = tuple(args.only)
    rows = []
    for fw in args.frameworks:
        rows += bench(fw, launchers, args)
    write(args.json, rows)


def bench(fw, launchers, args):
    """One framework's rows: every launcher at every np, interleaved."""
    print(f"\n== {fw}", flush=True)

    rates = {n: {np: [] for np in args.np} for n in launchers}
    cpu = {n: {np: [] for np in args.np} for n in launchers}
    loads = [os.getloadavg()]
    with scratch_runs("bench_training-") as run_root:
        print(f"warm-up (Spark session, first runs): np={min(args.np)}, 20 steps", flush=True)
        for name in launchers:
            measure(name, fw, min(args.np), 20, 5, run_root)
        for rep in range(args.reps):
            order = launchers[rep % len(launchers):] + launchers[:rep % len(launchers)]
            for np in args.np:
                for name in order:
                    rank0 = measure(name, fw, np, args.steps, args.warmup, run_root)
                    rates[name][np].append(rank0["steps_per_s"])
                    cpu[name][np].append(rank0["cpu_ms_per_step"])
                    print(f"  rep {rep} np={np} {name:17s} {rank0['steps_per_s']:8.1f} steps/s, "
                          f"rank 0 CPU {rank0['cpu_ms_per_step']:.2f} ms/step", flush=True)
            loads.append(os.getloadavg())

    medians = {n: {np: statistics.median(v) for np, v in by_np.items()} for n, by_np in rates.items()}
    cpu_medians = {n: {np: statistics.median(v) for np, v in by_np.items()} for n, by_np in cpu.items()}
    print(f"\nrank 0 steps/s, median of {args.reps} ({args.steps} steps after {args.warmup}); "
          "ratio to horovodrun; min-max; rank 0 CPU ms/step")
    print(f"{'launcher':18s}" + "".join(f"{'np=' + str(np):>36s}" for np in args.np))
    for name in launchers:
        ref = medians.get("horovodrun", medians[name])
        cells = [f"{medians[name][np]:.1f} ({medians[name][np] / ref[np]:.2f}x) "
                 f"{min(rates[name][np]):.0f}-{max(rates[name][np]):.0f} {cpu_medians[name][np]:.2f}"
                 for np in args.np]
        print(f"{name:18s}" + "".join(f"{c:>36s}" for c in cells))
    print(f"load average seen: {', '.join('%.1f' % la[0] for la in loads)}")
    rows = rows_against("training" if fw == "torch" else f"training-{fw}", rates, "horovodrun",
                        unit="steps/s", better="higher",
                        steps=args.steps, warmup=args.warmup, reps=args.reps,
                        loads=[round(la[0], 2) for la in loads])
    for r in rows:
        r["cpu_ms_per_step"] = cpu_medians[r["name"]][r["np"]]
    return rows


if __name__ == "__main__":
    main()
