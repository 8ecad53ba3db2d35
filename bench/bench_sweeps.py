"""A sweep's cost: 8 trials × 2 ranks with 2 at once (`hvd_magic.sweep`, driver launcher),
against the same 8 trials run one after another (a loop of `hvd_magic.run`, what a notebook
does without sweeps) and against the ideal (the trials' own run times divided by the
concurrency); the time from a trial's end to the next trial's first step; an early stop's
delay from the decision to every rank's exit.

Each trial sleeps through its steps (a GPU-bound step leaves the host's cores free): on this
2-core machine, CPU-bound trials two at a time would measure the cores, not the sweep.

    .venv/bin/python bench/bench_sweeps.py [--reps 2] [--trials 8] [--steps 20] [--json PATH]

Ray Tune with TorchTrainer is not installed here (no side-by-side row). Not a test: numbers
live here only.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import hvd_magic
from hvd_magic.view import TextView
from rows import row, write


def trial(lr, steps=20, pause=0.1, mark=None):
    import os
    import time

    import hvd_magic
    if mark and os.environ.get("RANK") == "0":
        with open(f"{mark}-{lr}", "w") as f:
            f.write(str(time.time()))
    for step in range(1, steps + 1):
        time.sleep(pause)
        hvd_magic.report(step=step, loss=lr / step)
    return lr


def one_rep(args, folder):
    lrs = [0.1 * (i + 1) for i in range(args.trials)]
    kwargs = {"steps": args.steps, "pause": args.pause, "mark": os.path.join(folder, "first")}
    start = time.perf_counter()
    sweep = hvd_magic.sweep(trial, np=-2, params={"lr": lrs}, slots=4, trials_at_once=2,
                            kwargs=kwargs, view=None)
    swept = time.perf_counter() - start
    assert all(t.state == "done" for t in sweep.trials), sweep.table()
    own = [t.run.ended - t.run.started for t in sweep.trials]
    firsts = {t.number: float(open(f"{kwargs['mark']}-{t.values['lr']}").read())
              for t in sweep.trials}
    ends = sorted(t.run.ended for t in sweep.trials)
    # each trial after the first two starts when one ends: its first step after that end
    gaps = [firsts[t.number] - max(e for e in ends if e <= t.run.started + 1e-3)
            for t in sweep.trials[2:]]
    start = time.perf_counter()
    for lr in lrs:
        hvd_magic.run(trial, np=-2, kwargs=dict(kwargs, lr=lr, mark=None),
                      view=TextView(quiet=True))
    serial = time.perf_counter() - start
    return swept, serial, sum(own) / 2, gaps


def stop_delay(args):
    sweep = hvd_magic.sweep(trial, np=-2, params={"lr": [1.0]}, slots=2, background=True,
                            kwargs={"steps": 1000, "pause": args.pause}, view=None)
    the = sweep.trials[0]
    while the.step is None or the.step < 5:
        time.sleep(0.05)
    decided = time.monotonic()
    sweep.stop_trial(0)
    sweep.wait()
    assert the.state == "stopped", the
    return max(r.ended_at for r in the.run.ranks) - decided, the.stopped_at


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.1)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    swept, serial, ideal, gaps, delays = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-sweeps-") as folder:
        os.chdir(folder)
        for _ in range(args.reps):
            s, one_by_one, best, g = one_rep(args, folder)
            swept.append(s), serial.append(one_by_one), ideal.append(best), gaps.extend(g)
            print(f"sweep {s:.2f} s, one after another {one_by_one:.2f} s, ideal {best:.2f} s, "
                  f"gaps {', '.join(f'{x:.2f}' for x in g)}", flush=True)
            delay, step = stop_delay(args)
            delays.append(delay)
            print(f"stop: every rank out {delay:.2f} s after the decision (at step {step})",
                  flush=True)
    what = f"{args.trials} trials × 2 ranks"
    rows = [row("sweeps", f"{what}, one after another", 2, serial),
            row("sweeps", f"{what}, the ideal (own times / 2)", 2, ideal),
            row("sweeps", f"{what}, sweep with 2 at once", 2, swept,
                ref=statistics.median(ideal), reference="the ideal",
                ideal_over_sweep=statistics.median(ideal) / statistics.median(swept),
                over_serial=statistics.median(swept) / statistics.median(serial)),
            row("sweeps", "a trial's end to the next trial's first step", 2, gaps),
            row("sweeps", "an early stop: the decision to every rank's exit", 2, delays)]
    for r in rows:
        print(json.dumps(r), flush=True)
    write(args.json, rows)


if __name__ == "__main__":
    main()
