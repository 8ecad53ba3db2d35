"""The driver side at scale: N simulated ranks (64 to 1024) against the real event server, driver
loop, run folder and view, and what that costs the notebook's process.

What is real: a `Run` (its `EventServer`, its driver loop in this process's main thread, its run
folder, its view: the ipywidgets `Dashboard` objects, or the `TextView` writing to a null stream).
What is simulated: the ranks. A `SimulatedLauncher` starts a few worker processes
(multiprocessing); each holds one real `EventClient` connection per rank it plays (as every Spark
task holds one) and sends what a training rank's task sends: its state (starting, running), a batch
of log lines and a progress event (step/total as a tqdm bar gives, and the `report()` points since
the last one) every `--tick` seconds, then its exit. With the defaults a rank prints 100 lines/s
and reports metrics at 10 Hz: 10 events/s per rank. Each event carries the wall time it was sent
at (`sent`), read back where the view gets the event: the latency.

Then the memory phase: every rank sends `--points` metric points (2 metrics each) in events of
1000 points (as a rank's throttle sends a tight loop's points), and the growth of this process's
RSS is measured with the run still held (its `MetricHistory`s keep at most `KEEP` values a metric,
thinned; `last_run().metrics` reads every point back from events.jsonl). Its peak while the run
went is sampled too, with the event queue's longest backlog: events decoded, not yet applied.

    .venv/bin/python bench/bench_scale.py [--np 64 256 1024] [--seconds 20] [--view dashboard]
    .venv/bin/python bench/bench_scale.py --quick          # np 16 and 64, 5 s each

Reported per N: the driver's CPU (this process: the event server's thread, the driver loop, the
view) as a share of one core while every rank streams (until the first bulk or exit event), and
per event; latency p50/p99; events lost (sent by the simulators, never seen by the view: must be
0); bytes written to the run folder; RSS growth for the points (at the end, and its peak), the
bytes of the metric history itself, and the longest backlog of the event queue. The machine's
load average is printed beside them: on a shared 2-core machine the simulators compete with the
driver for the cores.

Not a test: timings live here only.
"""

import argparse
import contextlib
import gc
import io
import json
import multiprocessing
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import threading
import time

import psutil

from rows import row, write

RANKS_PER_HOST = 8
METRICS = ("loss", "accuracy")


# --- the simulated ranks (in worker processes) ------------------------------------------------

def simulate(address, token, ranks, np, seconds, tick, lines_per_tick, points_per_tick,
             memory_points, counts):
    """Play `ranks`: one real EventClient each, realistic traffic for `seconds`, then the exit.
    Puts {rank: events sent} on `counts` at the end."""
    from hvd_magic.events import EventClient
    # Real ranks run on other machines: on this one, the driver is served first.
    os.nice(10)
    clients = {r: EventClient(address, token) for r in ranks}
    sent = dict.fromkeys(ranks, 0)

    def send(rank, event):
        event["rank"] = rank
        event["sent"] = time.time()
        clients[rank].send(event)
        sent[rank] += 1

    for r in ranks:
        send(r, {"t": "state", "state": "starting", "pid": 100000 + r,
                 "host": f"sim-host-{r // RANKS_PER_HOST}", "local_rank": r % RANKS_PER_HOST})
    for r in ranks:
        send(r, {"t": "state", "state": "running"})
    ticks = max(1, round(seconds / tick))
    total = ticks * points_per_tick
    start = time.monotonic()
    line = 0
    for k in range(ticks):
        for i, r in enumerate(ranks):
            lines = [f"epoch 1 step {k * points_per_tick + j} loss {1 / (1 + k):.4f} "
                     f"lr 0.01 images/s 812.3 (rank {r}, line {line + j})"
                     for j in range(lines_per_tick)]
            send(r, {"t": "lines", "stream": "stdout", "lines": lines})
            step = (k + 1) * points_per_tick - (r % 7 if k == ticks - 1 else 0)  # a few lag
            points = [[k * points_per_tick + j + 1,
                       {"loss": 1.0 / (1 + k + j / points_per_tick) + r * 1e-4,
                        "accuracy": 1 - 0.5 / (1 + k)}] for j in range(points_per_tick)]
            send(r, {"t": "progress", "step": step, "total": total,
                     "metrics": points[-1][1], "points": points})
        line += lines_per_tick
        delay = start + (k + 1) * tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    every, start = max(0.2, 0.01 * len(ranks)), time.monotonic()
    for k, chunk in enumerate(range(0, memory_points, 1000)):
        # a chunk every `every` s, about the pace the driver takes them at (~2.5 us a point,
        # decoding included): a real rank's points come over the whole run. Sends the driver
        # holds back (its event queue is bounded: docs/SCALING.md) delay the next chunk, not
        # add to the pause.
        time.sleep(max(0.0, start + (k + 1) * every - time.monotonic()))
        for r in ranks:
            points = [[total + s + 1, {"loss": 1.0 / (total + s + 1), "accuracy": 0.9}]
                      for s in range(chunk, min(memory_points, chunk + 1000))]
            send(r, {"t": "progress", "step": points[-1][0], "total": total + memory_points,
                     "metrics": points[-1][1], "points": points, "bulk": True})
    for r in ranks:
        send(r, {"t": "exit", "code": 0, "status": "ok"})
        clients[r].close()
    counts.put(sent)


def _simulate_quietly(*args):
    try:
        simulate(*args)
    except BaseException as exc:  # the harness reports it as lost events
        args[-1].put({"error": repr(exc)})


# --- the launcher that starts them ------------------------------------------------------------

def _launcher_class():
    from hvd_magic.launch.base import Launcher

    class SimulatedLauncher(Launcher):
        """Tasks played by `workers` processes; each rank's value is its rank."""

        where = "simulated ranks"

        def __init__(self, workers, seconds, tick, lines_per_tick, points_per_tick,
                     memory_points):
            super().__init__()
            self.workers = workers
            self.plan = (seconds, tick, lines_per_tick, points_per_tick, memory_points)
            self.sent = {}
            self.errors = []

        def start(self, settings, np):
            ctx = multiprocessing.get_context("spawn")
            counts = ctx.Queue()
            shares = [list(range(w, np, self.workers)) for w in range(self.workers)]
            procs = [ctx.Process(target=_simulate_quietly, daemon=True,
                                 args=(settings.events_address, settings.token, ranks, np,
                                       *self.plan, counts))
                     for ranks in shares if ranks]
            for p in procs:
                p.start()
            self._in_background(self._wait, "sim-wait", procs, counts, np)

        def _wait(self, procs, counts, np):
            for _ in procs:
                got = counts.get()
                if "error" in got:
                    self.errors.append(got["error"])
                else:
                    self.sent.update(got)
            for p in procs:
                p.join()
            self.outcomes = [(r, "ok", pickle.dumps(r)) for r in range(np)]

    return SimulatedLauncher


# --- what the driver side measures ------------------------------------------------------------

class Measured:
    """The run's view, wrapped: latency of each event where the view gets it, events seen per
    rank, the CPU of this process while every rank streams (from the first rank's "running" to
    the first exit), and the time the view's `tick` takes."""

    def __init__(self, view):
        self.view = view
        self.latencies = []
        self.seen = {}
        self.running = 0
        self.window = None           # (wall, cpu) at the start of the streaming window
        self.stream = None           # (seconds, cpu seconds, events) of the window
        self.events = 0
        self.ticks = []
        self._proc = psutil.Process()

    def _cpu(self):
        t = self._proc.cpu_times()
        return t.user + t.system

    def start(self, run):
        self.view.start(run)

    def event(self, run, rank, event):
        sent = event.get("sent")
        if sent is not None:
            if not event.get("bulk"):  # the memory phase's backlog is not live traffic
                self.latencies.append(time.time() - sent)
            self.seen[rank] = self.seen.get(rank, 0) + 1
            self.events += 1
            kind = event.get("t")
            if kind == "state" and event.get("state") == "running":
                self.running += 1
                if self.running == 1:
                    self.window = (time.monotonic(), self._cpu(), self.events)
            elif (kind == "exit" or event.get("bulk")) and self.stream is None \
                    and self.window is not None:  # the end of the live traffic
                wall, cpu, events = self.window
                self.stream = (time.monotonic() - wall, self._cpu() - cpu, self.events - events)
        self.view.event(run, rank, event)

    def tick(self, run):
        start = time.perf_counter()
        with _quiet_display(self.view):
            self.view.tick(run)
        self.ticks.append(time.perf_counter() - start)

    def finish(self, run):
        with _quiet_display(self.view):
            self.view.finish(run)


@contextlib.contextmanager
def _quiet_display(view):
    """Outside a kernel, IPython's display() prints the widgets' repr: keep it off the output."""
    if getattr(view, "box", True) is None or hasattr(view, "_show_picture"):
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    else:
        yield


def make_view(kind):
    if kind == "dashboard":
        from hvd_magic.view.dashboard import Dashboard
        return Dashboard()
    from hvd_magic.view.text import TextView
    null = open(os.devnull, "w")
    return TextView(stdout=null, stderr=null)


class Peak:
    """This process's highest RSS and the run's longest event queue, sampled every 0.1 s from a
    thread while the run goes (`with Peak(run) as peak:`)."""

    def __init__(self, run):
        self.run, self.rss, self.queued = run, 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        proc = psutil.Process()
        while not self._done.wait(0.1):
            self.rss = max(self.rss, proc.memory_info().rss)
            server = getattr(self.run, "_server", None)
            if server is not None and hasattr(server.events, "qsize"):
                self.queued = max(self.queued, server.events.qsize())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def one_run(np, args, root):
    from hvd_magic.driver.run import Run
    from hvd_magic.config import RunOptions
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    launcher = _launcher_class()(args.workers, args.seconds, args.tick, args.lines_per_tick,
                                 args.points_per_tick, args.points)
    measured = Measured(make_view(args.view))
    run = Run(np, RunOptions(run_dir=os.path.join(root, f"np{np}")), launcher=launcher,
              view=measured)
    load0 = os.getloadavg()[0]
    start = time.monotonic()
    with Peak(run) as peak:
        run.launch({"fn": pickle.dumps(None), "args": []}, {})
    wall = time.monotonic() - start
    gc.collect()
    rss = psutil.Process().memory_info().rss - rss0
    lost = sum(launcher.sent.values()) - sum(measured.seen.values()) + len(launcher.errors) * 10**6
    seconds, cpu, events = measured.stream or (float("nan"),) * 3
    result = {
        "np": np, "wall": wall, "state": run.state, "cpu_share": cpu / seconds,
        "cpu_per_event_us": 1e6 * cpu / max(1, events), "events_per_s": events / seconds,
        "p50": percentile(measured.latencies, 0.5), "p99": percentile(measured.latencies, 0.99),
        "lost": lost, "bytes": folder_bytes(run.run_dir), "rss_mb": rss / 2**20,
        "peak_rss_mb": (peak.rss - rss0) / 2**20, "queued": peak.queued,
        "history_mb": sum(r.history.nbytes() for r in run.ranks) / 2**20,
        # at the full rate (--tick) of every rank, from the CPU per event measured
        "cpu_share_full_rate": cpu / max(1, events) * np * 2 / args.tick,
        "points": sum(r.history.reported for r in run.ranks),
        "points_kept": sum(len(r.history) for r in run.ranks),
        "tick_p99_ms": 1e3 * (percentile(measured.ticks, 0.99) or 0),
        "load": (load0 + os.getloadavg()[0]) / 2, "errors": launcher.errors,
    }
    del run
    shutil.rmtree(os.path.join(root, f"np{np}"), ignore_errors=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long every rank streams")
    parser.add_argument("--tick", type=float, default=0.2,
                        help="seconds between a rank's two (lines, progress) events")
    parser.add_argument("--lines-per-tick", type=int, default=20)
    parser.add_argument("--points-per-tick", type=int, default=2)
    parser.add_argument("--points", type=int, default=10_000,
                        help="metric points per rank in the memory phase")
    parser.add_argument("--workers", type=int, default=4, help="processes playing the ranks")
    parser.add_argument("--view", choices=["dashboard", "text"], default="dashboard")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="np 16 and 64, 5 s, 1000 points")
    parser.add_argument("--json", help="write the rows here (bench/rows.py)")
    args = parser.parse_args()
    if args.quick:
        args.np, args.seconds, args.points = [16, 64], 5.0, 1000

    root = tempfile.mkdtemp(prefix="bench_scale-")
    rows = []
    rate = 2 / args.tick
    print(f"each rank: {args.lines_per_tick / args.tick:.0f} lines/s, "
          f"{args.points_per_tick / args.tick:.0f} metric points/s, {rate:.0f} events/s, "
          f"{args.seconds:.0f} s, then {args.points} points; view: {args.view}; "
          f"{args.workers} simulator processes; {os.cpu_count()} cores", flush=True)
    try:
        for np in args.np:
            results = [one_run(np, args, root) for _ in range(args.reps)]
            for res in results:
                print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                  for k, v in res.items()}), flush=True)
            extra = dict(view=args.view, reps=args.reps, events_per_rank_s=rate,
                         load=statistics.median(r["load"] for r in results),
                         lost=sum(r["lost"] for r in results),
                         points_per_rank=args.points)
            for key, name, unit in [
                    ("cpu_share", "driver CPU while streaming (share of a core)", "core"),
                    ("cpu_per_event_us", "driver CPU per event", "us"),
                    ("cpu_share_full_rate", "driver CPU at the full rate (per event x rate)",
                     "core"),
                    ("events_per_s", "events/s the simulators reached", "1/s"),
                    ("history_mb", "metric history held (columns)", "MB"),
                    ("p50", "latency p50 (send to view)", "s"),
                    ("p99", "latency p99 (send to view)", "s"),
                    ("rss_mb", f"RSS growth, {args.points} points/rank kept", "MB"),
                    ("peak_rss_mb", "RSS growth at its peak while the run went", "MB"),
                    ("queued", "event queue's longest backlog", "events"),
                    ("bytes", "bytes written to the run folder", "B"),
                    ("tick_p99_ms", "view tick p99", "ms")]:
                # the unit in the name: BENCHMARKS.md heads a table with one unit
                rows.append(row("scale", f"{name} ({unit})", np, [r[key] for r in results],
                                unit=unit, **extra))
            if any(r["lost"] for r in results):
                print(f"np {np}: EVENTS LOST", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        write(args.json, rows)
    return 1 if any(r.get("lost") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
