"""Where the CPU of a DeepSpeed ZeRO-2 (or DDP) training run goes, per process and per thread, under
hvd_magic (``--np -2``, ``--np 2``) and under torchrun (#82). CPU time, not wall clock: it holds
on a machine others load.

Each rank runs `bench_jaxds.ds_train` (or `bench_ddp.train`) and measures its own threads' CPU
(``/proc/self/task/TID/schedstat``: nanoseconds on a CPU) and context switches over the timed
steps alone, and counts the events it writes to the driver by kind. The launching process samples
its own threads and every descendant process (psutil) every `SAMPLE_S`; their CPU over the same
window (rank 0's clock: CLOCK_MONOTONIC, one per machine) is interpolated from the samples.

    .venv/bin/python bench/bench_dscpu.py [--how torchrun driver spark] [--pairs 3]
                                          [--steps 300] [--train ds|ddp] [--json PATH]

Prints, per launch: rank 0's steps/s, CPU ms per step of each rank (by thread group), of the
launching process (by thread), of every other process in the tree, the events per step and
the driver's context switches (wakeups) per second. Not a test: timings live here only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)
SAMPLE_S = 0.25


def thread_times():
    """{tid: (name, cpu ns, context switches)} of this process's threads."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{tid}/status") as f:
                switches = sum(int(line.split()[1]) for line in f
                               if line.endswith("ctxt_switches\n") or "ctxt_switches:" in line)
        except OSError:
            continue
        out[int(tid)] = (names.get(int(tid), comm), ns, switches)
    return out


def thread_delta(before, after):
    """{name: [cpu ms, switches]} between two `thread_times` (threads born since count whole)."""
    delta = {}
    for tid, (name, ns, sw) in after.items():
        _, ns0, sw0 = before.get(tid, (name, 0, 0))
        entry = delta.setdefault(name, [0.0, 0])
        entry[0] += (ns - ns0) / 1e6
        entry[1] += sw - sw0
    return delta


class EventCount:
    """The rank's writes to the driver's event pipe, counted by kind (none under torchrun)."""

    def __init__(self):
        self.kinds = {}
        channel = getattr(sys.modules.get("hvd_magic.rank.reporting"), "_channel", None)
        if channel is not None:
            write = channel.write

            def counted(event):
                self.kinds[event.get("t", "?")] = self.kinds.get(event.get("t", "?"), 0) + 1
                return write(event)
            channel.write = counted


def measured(train_fn):
    """`train_fn(steps, on_window=...)` with this rank's CPU over its timed window."""
    def run(steps):
        count = EventCount()
        marks = {}

        def on_window(edge):
            marks[edge] = (time.monotonic(), thread_times(), dict(count.kinds))
        rate = train_fn(steps, on_window=on_window)
        (t0, th0, ev0), (t1, th1, ev1) = marks["start"], marks["end"]
        return {"rate": rate, "t0": t0, "t1": t1, "steps": steps, "pid": os.getpid(),
                "threads": thread_delta(th0, th1),
                "events": {k: v - ev0.get(k, 0) for k, v in ev1.items()}}
    return run


def ds_cpu(steps):
    from bench_jaxds import ds_train
    return measured(ds_train)(steps)


def ddp_cpu(steps):
    from bench_ddp import train
    return measured(train)(steps)


TRAIN = {"ds": ds_cpu, "ddp": ddp_cpu}


class TreeSampler(threading.Thread):
    """This process's threads and every descendant's CPU, sampled every `SAMPLE_S`."""

    def __init__(self):
        super().__init__(name="bench-sampler", daemon=True)
        self.samples = []  # (monotonic, {tid: ...}, {pid: (label, cpu s, switches)})
        self.done = threading.Event()

    def run(self):
        import psutil
        me = psutil.Process()
        while not self.done.is_set():
            procs = {}
            for p in me.children(recursive=True):
                try:
                    with p.oneshot():
                        t = p.cpu_times()
                        c = p.num_ctx_switches()
                        procs[p.pid] = (label(p), t.user + t.system, c.voluntary + c.involuntary)
                except psutil.Error:
                    continue
            self.samples.append((time.monotonic(), thread_times(), procs))
            self.done.wait(SAMPLE_S)

    def window(self, t0, t1):
        """({thread name: [ms, switches]}, {label: [ms, switches, count]}) between t0 and t1,
        from the samples nearest each edge inside the window."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return {}, {}, 0.0
        (a, th0, pr0), (b, th1, pr1) = inside[0], inside[-1]
        procs = {}
        for pid, (name, cpu, sw) in pr1.items():
            if pid in pr0:
                entry = procs.setdefault(name, [0.0, 0, 0])
                entry[0] += (cpu - pr0[pid][1]) * 1e3
                entry[1] += sw - pr0[pid][2]
                entry[2] += 1
        return thread_delta(th0, th1), procs, b - a


def label(p):
    cmd = " ".join(p.cmdline())
    for key, name in (("hvd_magic.rank", "rank"), ("template.server", "template"),
                      ("torch.distributed.run", "torchrun-agent"), ("--ds-child", "rank"),
                      ("--child", "rank"), ("pyspark.daemon", "spark-python-daemon"),
                      ("pyspark.worker", "spark-python-worker"), ("java", "jvm")):
        if key in cmd:
            return name
    return p.name()


def launch(how, steps, train, run_root):
    """[each rank's measure], and the launcher side's sampler."""
    sampler = TreeSampler()
    sampler.start()
    try:
        if how == "torchrun":
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            sys.path.insert(0, os.path.dirname(HERE))
            from bench_jaxds import extensions_env
            env.update({k: v for k, v in extensions_env().items() if k in
                        ("TORCH_EXTENSIONS_DIR", "DS_ACCELERATOR")})
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node=2", HERE, "--child", train, str(steps)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if out.returncode:
                raise RuntimeError(out.stderr[-2000:])
            ranks = [json.loads(line[5:]) for line in out.stdout.splitlines()
                     if line.startswith("CPU: ")]
        else:
            import hvd_magic
            from hvd_magic.view import TextView
            run = hvd_magic.run(TRAIN[train], np=2 if how == "spark" else -2, args=(steps,),
                                run_dir=tempfile.mkdtemp(dir=run_root),
                                fresh=True if how == "driver-fresh" else None,
                                view=TextView(quiet=True))
            ranks = list(run.results)
    finally:
        sampler.done.set()
        sampler.join()
    return ranks, sampler


def summary(how, ranks, sampler):
    r0 = min(ranks, key=lambda r: r["t0"])
    t0, t1 = max(r["t0"] for r in ranks), min(r["t1"] for r in ranks)
    steps = r0["steps"]
    threads, procs, span = sampler.window(t0, t1)
    share = span / (r0["t1"] - r0["t0"]) if span else 0
    out = {"how": how, "rate": ranks[0]["rate"], "ranks": [], "events_per_step": {}}
    for r in ranks:
        groups = {}
        for name, (ms, sw) in r["threads"].items():
            key = "main" if name == "MainThread" else name
            g = groups.setdefault(key, [0.0, 0])
            g[0] += ms / steps
            g[1] += sw / steps
        out["ranks"].append({"total": sum(g[0] for g in groups.values()),
                             "threads": {k: round(v[0], 3) for k, v in sorted(
                                 groups.items(), key=lambda kv: -kv[1][0]) if v[0] >= 0.005},
                             "switches_per_step": round(sum(g[1] for g in groups.values()), 2)})
    for kind, n in ranks[0]["events"].items():
        out["events_per_step"][kind] = n / steps
    sampled_steps = steps * share
    if sampled_steps:
        out["launcher_threads"] = {k: round(v[0] / sampled_steps, 3) for k, v in sorted(
            threads.items(), key=lambda kv: -kv[1][0]) if v[0] / sampled_steps >= 0.002}
        out["launcher_total"] = sum(v[0] for k, v in threads.items()
                                    if k != "bench-sampler") / sampled_steps
        out["launcher_wakeups_per_s"] = sum(v[1] for k, v in threads.items()
                                            if k != "bench-sampler") / span
        out["other_procs"] = {k: [round(v[0] / sampled_steps, 3), round(v[1] / span, 1), v[2]]
                              for k, v in procs.items() if k != "rank"}
    return out


def show(s):
    print(f"\n[{s['how']}] rank 0 {s['rate']:.1f} steps/s; events/step {s['events_per_step']}")
    for i, r in enumerate(s["ranks"]):
        print(f"  rank {i}: {r['total']:.3f} ms CPU/step, {r['switches_per_step']} switches/step;"
              f" threads {r['threads']}")
    if "launcher_total" in s:
        print(f"  launcher process: {s['launcher_total']:.3f} ms CPU/step, "
              f"{s['launcher_wakeups_per_s']:.0f} wakeups/s; threads {s['launcher_threads']}")
        print(f"  other processes [ms/step, switches/s, n]: {s['other_procs']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--how", nargs="+", default=["torchrun", "driver"],
                        choices=["torchrun", "driver", "driver-fresh", "spark"])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--train", default="ds", choices=sorted(TRAIN))
    parser.add_argument("--json")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, os.path.dirname(HERE))
        value = TRAIN[args.child[0]](int(args.child[1]))
        print("CPU: " + json.dumps(value), flush=True)
        os._exit(0)
    sys.path.insert(0, os.path.dirname(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
    run_root = tempfile.mkdtemp(prefix="bench_dscpu-")
    results = []
    for rep in range(args.pairs):
        order = args.how if rep % 2 == 0 else args.how[::-1]
        for how in order:
            s = summary(how, *launch(how, args.steps, args.train, run_root))
            show(s)
            results.append(s)
    print("\nmedians:")
    for how in args.how:
        mine = [s for s in results if s["how"] == how]
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        print(f"  {how:9s} rate {med([s['rate'] for s in mine]):6.1f} (best "
              f"{max(s['rate'] for s in mine):.1f}) steps/s; rank CPU/step "
              f"{med([sum(r['total'] for r in s['ranks']) / len(s['ranks']) for s in mine]):.3f}"
              f" ms; launcher {med([s.get('launcher_total', 0) for s in mine]):.3f} ms/step")
    from rows import write
    write(args.json, results)


if __name__ == "__main__":
    main()
