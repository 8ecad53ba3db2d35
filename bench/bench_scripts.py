"""Training scripts and MLflow (issue #28): what MLflow logging costs per reported point, and a
script's launch beside the same code in a cell.

- MLflow, what a training step pays: a rank (``--np -1``) runs ``--points`` steps of 5 ms of CPU
  work with a ``report()`` each, its run logged to a real ``mlflow server`` (SQLite store) or
  not, alternating; the difference of its mean step times is the cost per point, its ratio to a
  5 ms step the share (goal: < 1%).
- MLflow, the work itself: the driver's tracker (`hvd_magic.driver.tracking.MlflowTracker`) is
  fed what the driver loop feeds it at one point per 5 ms step (an event of 20 points every
  0.1 s, the loop's ticks) in real time; the CPU this process and the server spend beyond the
  same feed without a tracker, per point (MLflow's store writes each metric: this is its price,
  paid off the ranks' cores where the driver has one of its own). Server and a SQLite file.
- ``script``: ``%horovod --np 2 --quiet script.py`` and ``%%horovod --np 2 --quiet`` with the
  same code (``hvd.init()`` and one allreduce) through a real IPython shell, alternating, on one
  warm embedded Spark session; the ratio is script / cell (goal: <= 1.05).

    .venv/bin/python bench/bench_scripts.py [--reps 5] [--points 1000] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import types

from rows import row as make_row, write

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from conftest import start_mlflow_server  # noqa: E402  (the tests' own mlflow server)

STEP = 0.005       # seconds of the training step each point stands for
EVENT_EVERY = 0.1  # the rank's batching of its points (hvd_magic.rank.reporting.MIN_INTERVAL)

CODE = """\
import torch, horovod.torch as hvd
hvd.init()
hvd.allreduce(torch.ones(1)).item()
"""


def feed(tracker, points):
    """Feed `tracker` (or nothing, for None) what the driver loop would during a run whose rank 0
    reports one point per 5 ms step, in real time; the CPU seconds this process spent."""
    run = types.SimpleNamespace(where="bench", ranks=[], np=2)
    per_event = int(EVENT_EVERY / STEP)
    sent, began, cpu = 0, time.monotonic(), time.process_time()
    while sent < points:
        due = began + (sent + per_event) * STEP
        while time.monotonic() < due:  # the driver loop ticks while it waits for events
            if tracker is not None:
                tracker.tick(run)
            time.sleep(0.01)
        event = {"t": "progress", "points": [[sent + i, {"loss": 1.0 / (sent + i + 1)}]
                                              for i in range(per_event)]}
        if tracker is not None:
            tracker.event(run, 0, event)
            tracker.tick(run)
        sent += per_event
    if tracker is not None:  # the end of the run: the rest, and the sender done
        tracker.flush()
        tracker._outbox.put(None)
        tracker._sender.join()
    return time.process_time() - cpu


def tracker_cpu(uri, points, server=None):
    """CPU seconds per point that logging costs: this process's (the tracker, MLflow's client or
    its SQLite store) and the tracking server's, over the same feed without a tracker."""
    import mlflow
    import psutil

    from hvd_magic.driver.tracking import MlflowTracker

    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    run_id = client.create_run("0").info.run_id
    tracker = MlflowTracker(mlflow, client, run_id, own=True).wrap(None, {}, {})
    tracker._params_logged = True  # params are once per run, not per point
    procs = [psutil.Process(server.pid)] + psutil.Process(server.pid).children(recursive=True) \
        if server is not None else []

    def server_cpu():
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    before = server_cpu()
    spent = feed(tracker, points) + server_cpu() - before
    bare = feed(None, points)
    client.set_terminated(run_id)
    assert len(client.get_metric_history(run_id, "loss")) == points
    return (spent - bare) / points


def spin_steps(steps, step):
    """A rank's training loop: `steps` steps of `step` seconds of CPU work, a report each."""
    import time
    import hvd_magic
    start = time.perf_counter()
    for i in range(steps):
        until = time.perf_counter() + step
        while time.perf_counter() < until:
            pass
        hvd_magic.report(step=i, loss=1.0 / (i + 1))
    return (time.perf_counter() - start) / steps


def step_times(url, reps, steps):
    """A rank's mean step time, its run logged to MLflow (the server) or not, alternating."""
    import mlflow

    import hvd_magic
    from hvd_magic.view import TextView

    mlflow.set_tracking_uri(url)
    times = {True: [], False: []}
    for _ in range(reps):
        for logged in (True, False):
            run = hvd_magic.run(spin_steps, np=-1, args=(steps, STEP), view=TextView(quiet=True),
                                mlflow="bench" if logged else False)
            times[logged].append(run.value)
    return times


def launch_times(reps, tmp):
    """(script seconds, cell seconds) per repetition, through a real IPython shell."""
    from IPython.testing.globalipapp import start_ipython

    os.environ["HVD_MAGIC_NO_WIDGETS"] = "1"
    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    script = os.path.join(tmp, "script.py")
    with open(script, "w") as f:
        f.write(CODE)
    ip.run_line_magic("horovod", f"--np 2 --quiet {script}")  # warm: Spark's start, page cache
    ip.run_cell_magic("horovod", "--np 2 --quiet", CODE)
    times = {"script": [], "cell": []}
    for _ in range(reps):
        for kind in ("script", "cell"):
            start = time.perf_counter()
            if kind == "script":
                ip.run_line_magic("horovod", f"--np 2 --quiet {script}")
            else:
                ip.run_cell_magic("horovod", "--np 2 --quiet", CODE)
            times[kind].append(time.perf_counter() - start)
    from pyspark import SparkContext
    SparkContext._active_spark_context.stop()  # the embedded session's JVM ends with the bench
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scripts-") as tmp:
        os.chdir(tmp)  # run folders and MLflow's files go here
        server, url = start_mlflow_server(tmp, os.path.join(tmp, "server.log"))
        try:
            steps = step_times(url, args.reps, args.points)
            per_point = [a - b for a, b in zip(steps[True], steps[False])]
            rows.append(make_row("scripts", "MLflow: a rank's step time, per point", -1,
                                 per_point, ref=STEP, points=args.points, reps=args.reps,
                                 logged=steps[True], unlogged=steps[False]))
            for name, uri, proc in (("MLflow: CPU per point, server (SQLite)", url, server),
                                    ("MLflow: CPU per point, SQLite file", f"sqlite:///{tmp}/c.db",
                                     None)):
                tracker_cpu(uri, 40, proc)  # the store's first use is not per point
                cpu = [tracker_cpu(uri, args.points, proc) for _ in range(args.reps)]
                rows.append(make_row("scripts", name, None, cpu, ref=STEP, points=args.points,
                                     reps=args.reps))
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=30)
        times = launch_times(args.reps, tmp)
        os.chdir(os.path.dirname(os.path.abspath(__file__)))  # (IPython's exit reads the cwd)
    cell = make_row("scripts", "%%horovod cell", 2, times["cell"], reps=args.reps)
    rows += [cell, make_row("scripts", "%horovod script.py", 2, times["script"],
                            ref=cell["median"], reps=args.reps, reference="%%horovod cell")]
    for r in rows:
        print(json.dumps(r))
    for r in rows[:3]:
        print(f"{r['name']}: {r['median'] * 1e6:.1f} us (best {r['best'] * 1e6:.1f}), "
              f"{r['ratio'] * 100:.3f}% of a 5 ms step")
    print(f"launch: script {rows[-1]['median']:.2f} s, cell {cell['median']:.2f} s, "
          f"ratio {rows[-1]['ratio']:.3f}")
    write(args.json, rows)


if __name__ == "__main__":
    main()
