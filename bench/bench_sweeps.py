"""A sweep's cost: 8 trials × 2 ranks with 2 at once (`hvd_magic.sweep`, driver launcher),
against the same 8 trials run one after another (a loop of `hvd_magic.run`, what a notebook
does without sweeps) and against the ideal (the trials' own run times divided by the
concurrency); the time from a trial's end to the next trial's first step; an early stop's
delay from the decision to every rank's exit.

Each trial sleeps through its steps (a GPU-bound step leaves the host's cores free): on this
2-core machine, CPU-bound trials two at a time would measure the cores, not the sweep.

    .venv/bin/python bench/bench_sweeps.py [--reps 2] [--trials 8] [--steps 20] [--json PATH]
        [--ray PYTHON]

With `--ray PYTHON` (an interpreter that has `ray[tune,train]` and torch: Ray is not in the
project's venv), each repetition also runs the same sweep under Ray Tune with TorchTrainer
(bench/sweep_under_ray.py, in a process of its own, after hvd_magic's): its `Tuner.fit()`
timed as the sweep is, and Ray's start-up (import, `ray.init`) apart. Without it, or where that
interpreter lacks Ray, the Ray rows say so. Not a test: numbers live here only.
"""

import argparse
import json
import os
import statistics
import subprocess
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


RAY = "Ray Tune + TorchTrainer, 2 at once (`Tuner.fit()`)"


def ray_missing(python):
    """Why `python` cannot run the Ray sweep, or None when it can."""
    if not python:
        return "not installed (no --ray PYTHON given)"
    probe = subprocess.run([python, "-c", "import ray.tune, ray.train.torch"],
                           capture_output=True, text=True)
    if probe.returncode:
        return f"not installed in {python} ({probe.stderr.strip().splitlines()[-1:]})"
    return None


def ray_rep(args, folder):
    """One repetition of the sweep under Ray Tune (bench/sweep_under_ray.py): its times."""
    out = os.path.join(folder, "ray.json")
    subprocess.run([args.ray, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           "sweep_under_ray.py"),
                    "--out", out, "--trials", str(args.trials), "--steps", str(args.steps),
                    "--pause", str(args.pause)], check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        times = json.load(f)
    assert times["steps"] == [args.steps] * args.trials, times
    return times


def ray_rows(what, missing, runs, ideal, swept):
    if missing:
        return [dict(row("sweeps", RAY, 2, []), absent=missing)]
    median = statistics.median(r["sweep"] for r in runs)
    return [row("sweeps", RAY, 2, [r["sweep"] for r in runs], ref=ideal, reference="the ideal",
                ideal_over_sweep=ideal / median, over_hvd_magic=median / swept,
                ray=runs[0]["ray"]),
            row("sweeps", f"{what}, Ray's own times / 2", 2, [sum(r["own"]) / 2 for r in runs]),
            row("sweeps", "Ray's start-up: import ray", 2, [r["import"] for r in runs]),
            row("sweeps", "Ray's start-up: ray.init (local, 6 CPUs)", 2,
                [r["start"] for r in runs]),
            row("sweeps", "Ray's ray.shutdown()", 2, [r["shutdown"] for r in runs])]


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
    parser.add_argument("--ray", metavar="PYTHON",
                        help="an interpreter with ray[tune,train] and torch: the same sweep "
                             "under Ray Tune with TorchTrainer, beside")
    args = parser.parse_args()
    swept, serial, ideal, gaps, delays, rays = [], [], [], [], [], []
    missing = ray_missing(args.ray)
    if missing:
        print(f"Ray Tune: {missing}", flush=True)
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
            if not missing:
                rays.append(ray_rep(args, folder))
                print(f"Ray Tune: sweep {rays[-1]['sweep']:.2f} s, import ray "
                      f"{rays[-1]['import']:.2f} s, ray.init {rays[-1]['start']:.2f} s, trials' "
                      f"own times / 2 {sum(rays[-1]['own']) / 2:.2f} s", flush=True)
    what = f"{args.trials} trials × 2 ranks"
    rows = [row("sweeps", f"{what}, one after another", 2, serial),
            row("sweeps", f"{what}, the ideal (own times / 2)", 2, ideal),
            row("sweeps", f"{what}, sweep with 2 at once", 2, swept,
                ref=statistics.median(ideal), reference="the ideal",
                ideal_over_sweep=statistics.median(ideal) / statistics.median(swept),
                over_serial=statistics.median(swept) / statistics.median(serial)),
            row("sweeps", "a trial's end to the next trial's first step", 2, gaps),
            row("sweeps", "an early stop: the decision to every rank's exit", 2, delays),
            *ray_rows(what, missing, rays, statistics.median(ideal), statistics.median(swept))]
    for r in rows:
        print(json.dumps(r), flush=True)
    write(args.json, rows)


if __name__ == "__main__":
    main()
