"""Time to every rank's Python stack (issue #38): ``Run.stacks()`` on a running run.

Ranks on the driver launcher (``--np -N``), with real Horovod: every rank but the last waits in
an ``hvd.allreduce`` for the last, which sleeps in a function of its own (the hang that stacks are
asked for). Measured: the seconds `run.stacks()` takes to return every rank's stack, `--reps`
times, once the ranks are in place:

- ``python``: every rank answers from its helper thread (the GIL is free: the waits release it);
- ``gil-held``: the last rank is stuck in C code holding the GIL (a regular expression that
  backtracks), so its task falls back to faulthandler after its wait for the Python answer.

``--sim-np``: the same at counts whose real ranks (torch and Horovod each) do not fit this
machine: the ranks import neither; every rank but the last sleeps in ``wait_for_peer``, the last
in ``last_rank_busy``. The rank processes, their tasks' probes, helper threads and faulthandler
are real; only the collective is not (rows ``sim-python``, ``sim-gil-held``).

``--training-reps``: the machinery's cost when unused: steps/s of bench_training.py's MLP under
Horovod at np 2 on the driver launcher, with the ranks' helper thread and faulthandler
registration (``probe``) and without (``no-probe``: ``HVD_MAGIC_NO_PROBE=1``, a bench switch
only), interleaved; ratio probe / no-probe (goal >= 0.99).

    .venv/bin/python bench/bench_stacks.py [--np 2 8] [--sim-np 16 64] [--reps 10]
        [--training-reps 5] [--steps 500] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rows import row  # noqa: E402


def hang(gil):
    import re
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()

    def last_rank_busy():
        if gil:
            re.match(r"(a+)+$", "a" * 64 + "b")  # the `re` engine holds the GIL for ages
        time.sleep(600)

    if hvd.rank() == hvd.size() - 1:
        last_rank_busy()
    hvd.allreduce(torch.ones(2), name="grad")


def simulated_hang(gil):
    """`hang` without torch or Horovod: for rank counts whose real ranks do not fit."""
    import os
    import re
    import time

    def wait_for_peer():
        time.sleep(600)

    def last_rank_busy():
        if gil:
            re.match(r"(a+)+$", "a" * 64 + "b")
        time.sleep(600)

    rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    last_rank_busy() if rank == size - 1 else wait_for_peer()


def measure(np, gil, reps, simulated=False):
    import hvd_magic
    from hvd_magic.view.text import TextView

    waiting = "wait_for_peer" if simulated else "→ allreduce"
    run = hvd_magic.run(simulated_hang if simulated else hang, np=-np, args=(gil,),
                        background=True, view=TextView(quiet=True))
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # until every rank is in place
            if run.state != "running":
                raise RuntimeError(f"the run ended ({run.state}): {run.error}")
            stacks = run.stacks()
            text = stacks.text()
            if "last_rank_busy" in text and (np == 1 or waiting in text) \
                    and len(stacks) == np:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the ranks never got in place:\n{text}")
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            stacks = run.stacks()
            times.append(time.perf_counter() - started)
            assert len(stacks) == np, stacks.text()
        print(f"np {np} {'sim-' if simulated else ''}{'gil-held' if gil else 'python'}: "
              f"{', '.join(f'{t * 1000:.0f}' for t in times)} ms", flush=True)
        return times
    finally:
        run.cancel()
        try:
            run.wait(120)
        except hvd_magic.RunCancelled:
            pass


def training(reps, steps, warmup=50):
    """Rank 0's steps/s at np 2 (driver launcher), with and without the probe, interleaved."""
    import bench_training

    return bench_training.cost_of("stacks-cost", "HVD_MAGIC_NO_PROBE", "probe", "no-probe", reps,
                                  steps, warmup)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, nargs="*", default=[2, 8])
    p.add_argument("--sim-np", type=int, nargs="*", default=[])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--training-reps", type=int, default=0)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.chdir(os.environ.get("TMPDIR", "/tmp"))  # the run folders land there
    rows = []
    for simulated, counts in ((False, args.np), (True, args.sim_np)):
        for np in counts:
            for gil in (False, True):
                times = measure(np, gil, args.reps, simulated)
                name = ("sim-" if simulated else "") + ("gil-held" if gil else "python")
                note = "simulated ranks: no torch, no Horovod; real probes" if simulated else None
                rows.append(row("stacks", name, np, times, unit="s", reps=args.reps,
                                **({"note": note} if note else {})))
    if args.training_reps:
        rows += training(args.training_reps, args.steps)
    for r in rows:
        if r["unit"] == "s":
            print(f"{r['name']:>12} np {r['np']}: median {r['median'] * 1000:.0f} ms, "
                  f"best {r['best'] * 1000:.0f} ms")
        else:
            print(f"{r['name']:>12} np {r['np']}: median {r['median']:.1f} steps/s, "
                  f"best {r['best']:.1f}, ratio {r['ratio']:.3f}, "
                  f"paired ratio {r.get('paired_ratio', 1):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
