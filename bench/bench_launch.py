"""Launch overhead: a trivial Horovod cell under every launcher, against the floor.

The cell is ``import torch, horovod.torch; hvd.init()`` and one allreduce. Each launcher runs it on
N ranks of this machine, warm (the Spark session is started once, before any timing, and every
launcher runs once untimed); the figure is the wall time of the launching call, as its caller sees
it. Launchers, interleaved per repetition (their order rotates from one repetition to the next):

- ``floor``: N bare ``python bench/bench_launch.py --child hvd`` processes with Horovod's env set
  by hand against a `RendezvousServer` started here (DESIGN.md part 2): nothing but the work.
  Each in a session of its own, as hvd_magic's and horovodrun's ranks are: with the kernel's
  autogroup scheduling, N processes of one session share one CPU share against the other
  sessions of a busy machine, N sessions get N shares (on a loaded machine that alone made the
  floor 2-4x slower than the launchers). The server is stopped after the clock stops: Horovod's
  `RendezvousServer.stop` waits up to 0.5 s for its HTTP loop;
- ``floor-torch``: the same with ``torch.distributed`` (gloo, env:// init): TorchDistributor's floor;
- ``spark-floor``: the floor's ranks, each spawned by one task of a Spark barrier stage and
  nothing else (Spark's worker-only PYTHONPATH entries dropped, as hvd_magic does): what Spark
  itself adds, which no launcher on Spark can remove;
- ``spark-empty-job``: a barrier stage of N tasks that do nothing: Spark's fixed cost alone;
- ``hvd_magic-spark`` / ``hvd_magic-driver``: ``hvd_magic.run(cell, np=N, fresh=True)`` /
  ``np=-N``: every rank a new interpreter;
- ``hvd_magic-spark-fork`` / ``hvd_magic-driver-fork``: the same with ``fresh=False``: ranks
  forked from the host's template (`hvd_magic.template`), filled by the warm-up's run;
- ``horovodrun`` (default knobs, hence its 0 ms cycle), ``horovodrun-H`` (``-H localhost:N``),
  ``horovodrun-c5`` (``--cycle-time-ms 5``): the same code as a script;
- ``horovod.run``: ``horovod.runner.run(cell, np=N, use_gloo=True)``;
- ``TD-barrier`` / ``TD-local``: PySpark's ``TorchDistributor(num_processes=N, local_mode=...)``
  with the torch.distributed version of the cell (needs pyarrow: ``pip install -e '.[bench]'``).

Then, with ``--profile``, a few more hvd_magic runs record when each step of a launch happened
(driver side: the events `Run` hands its view; rank side: timestamps the cell takes) and print
the median breakdown, next to the floor's and to a bare barrier job that times Spark's own
``allGather`` and ``barrier`` (TorchDistributor uses them; hvd_magic did until it relayed the
rendezvous port over its event channel instead).

    .venv/bin/python bench/bench_launch.py [--np 1 2 4 8] [--reps 3] [--only NAME ...]
                                           [--profile] [--first-cell REPS] [--json PATH]

With ``--first-cell REPS``, the first cell that imports torch on a new template (driver-only),
against fresh ranks, and the template's memory (RSS, PSS).

Not a test: timings live here only.
"""

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from rows import row, rows_against, write

HERE = os.path.abspath(__file__)
BIN = os.path.dirname(sys.executable)
CHILD_TIMEOUT = 180  # seconds; a launch that takes longer is stopped and recorded as failed
# The knobs hvd_magic sets (api.DEFAULT_HOROVOD_ENV); the floor uses the same, to be fair.
KNOBS = {"HOROVOD_CYCLE_TIME": "1", "HOROVOD_CACHE_CAPACITY": "1024",
         "HOROVOD_GLOO_TIMEOUT_SECONDS": "300"}


# --- the cell -------------------------------------------------------------------------------

def cell():
    """The trivial cell; returns when each of its steps ended (time.time(), for --profile)."""
    import time
    marks = {"fn": time.time()}
    import torch
    import horovod.torch as hvd
    marks["imported"] = time.time()
    hvd.init()
    marks["init"] = time.time()
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    marks["allreduce"] = time.time()
    assert total == hvd.size(), total
    return marks


def torch_cell():
    """The same with torch.distributed (what TorchDistributor runs)."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size(), t
    dist.destroy_process_group()
    return t.item()


def child(kind):
    """A rank started as a script (horovodrun, the floors): run the cell, print when it ended.

    It ends as hvd_magic's rank does (Horovod shut down, then `os._exit`, skipping an interpreter
    teardown that costs ~1 s with torch loaded), so that launchers are compared, not exits.
    """
    if kind == "hvd":
        print(json.dumps(cell()), flush=True)
        import horovod.torch as hvd
        hvd.shutdown()
    else:
        torch_cell()
    sys.stdout.flush()
    os._exit(0)


# --- process hygiene ------------------------------------------------------------------------

def descendants():
    import psutil
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def end_processes(procs):
    """Kill processes we started (psutil objects), children first; wait for them."""
    import psutil
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def leftovers(before):
    """Processes we started that are still alive, but the JVM gateway (it ends with us) and
    zombies (already dead: the JVM's own children, reaped when it goes)."""
    import psutil
    left = []
    for pid, p in descendants().items():
        try:
            if pid not in before and p.status() != psutil.STATUS_ZOMBIE and "java" not in p.name():
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def clean_up(before):
    """Stop Spark, then end what this benchmark started and left running (`before`: the
    descendants there were at its start)."""
    stop_spark()
    left = leftovers(before)
    if left:
        print(f"ending {len(left)} leftover processes: "
              f"{[(p.pid, ' '.join(p.cmdline())[:80]) for p in left]}")
        end_processes(left)


@contextlib.contextmanager
def scratch_runs(prefix):
    """A temporary run root for a benchmark's runs; at the end, however it ends, the folder is
    removed, Spark stopped and what the runs left running ended (`clean_up`)."""
    run_root = tempfile.mkdtemp(prefix=prefix)
    before = set(descendants())
    try:
        yield run_root
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
        clean_up(before)


def stop_spark():
    """Stop the running SparkContext, if any (its Python workers go with it)."""
    from pyspark import SparkContext
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()


def run_cmd(cmd, env=None):
    """Run a launcher command; on timeout end it and everything it started (horovodrun's ranks
    run in sessions of their own, so a process-group kill would miss them)."""
    import psutil
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        tree = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
        end_processes(tree)
        proc.communicate()
        raise RuntimeError(f"{cmd[0]} timed out after {CHILD_TIMEOUT} s")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {proc.returncode}: {out[-2000:]}")
    return out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the launchers --------------------------------------------------------------------------

def base_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _wait_all(procs):
    outs = []
    deadline = time.monotonic() + CHILD_TIMEOUT
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            import psutil
            end_processes([psutil.Process(q.pid) for q in procs if q.poll() is None])
            raise RuntimeError("a floor rank timed out")
        if p.returncode != 0:
            raise RuntimeError(f"a floor rank exited {p.returncode}: {out[-2000:]}")
        outs.append(out)
    return outs


@contextlib.contextmanager
def _rendezvous(np):
    """Horovod's rendezvous server for `np` ranks on this host, started here, as horovodrun's:
    (the slots, its port); stopped at the end."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start()
    try:
        plan = get_host_assignments(parse_hosts(f"localhost:{np}"), np)
        server.init(plan)
        yield plan, port
    finally:
        server.stop()


def floor(np, marks=None):
    """N bare processes, Horovod's env by hand, a rendezvous server started here."""
    start = time.perf_counter()
    with _rendezvous(np) as (plan, port):
        procs = []
        for slot in plan:
            env = dict(base_env(), **_rank_env(slot, np, port))
            procs.append(subprocess.Popen([sys.executable, HERE, "--child", "hvd"], env=env,
                                          stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                          text=True, start_new_session=True))
        outs = _wait_all(procs)
        seconds = time.perf_counter() - start
    if marks is not None:
        marks.extend(json.loads(o.strip().splitlines()[-1]) for o in outs)
    return seconds


def _rank_env(slot, np, port):
    return dict(KNOBS, HOROVOD_RANK=str(slot.rank), HOROVOD_SIZE=str(np),
                HOROVOD_LOCAL_RANK=str(slot.local_rank), HOROVOD_LOCAL_SIZE=str(slot.local_size),
                HOROVOD_CROSS_RANK=str(slot.cross_rank), HOROVOD_CROSS_SIZE=str(slot.cross_size),
                HOROVOD_HOSTNAME=slot.hostname, HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
                HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_GLOO_IFACE="lo",
                HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo")


def _spark_floor_task(envs, script, iterator):
    """A barrier task that does only what the floor does for its rank: spawn it, wait."""
    import subprocess
    import sys
    from pyspark import BarrierTaskContext
    from hvd_magic.task.environ import rank_base_env
    partition = BarrierTaskContext.get().partitionId()
    env = dict(rank_base_env(), PYTHONUNBUFFERED="1", **envs[partition])
    env = {k: v for k, v in env.items() if not k.startswith("HOROVOD_") or k in envs[partition]}
    proc = subprocess.run([sys.executable, script, "--child", "hvd"], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, text=True, start_new_session=True)
    yield (proc.returncode, proc.stdout[-2000:])


def spark_floor(np):
    """The floor's ranks, each spawned by a task of one Spark barrier stage (nothing of
    hvd_magic's: no event channel, no forwarding): what Spark alone adds to the floor."""
    import functools

    sc = _Spark.get(np).sparkContext
    start = time.perf_counter()
    with _rendezvous(np) as (plan, port):
        envs = [_rank_env(slot, np, port) for slot in plan]
        task = functools.partial(_spark_floor_task, envs, HERE)
        outs = sc.parallelize(range(np), np).barrier().mapPartitions(task).collect()
        seconds = time.perf_counter() - start
    bad = [out for code, out in outs if code != 0]
    if bad:
        raise RuntimeError(f"a spark-floor rank failed: {bad[0]}")
    return seconds


def _empty_task(iterator):
    yield 0


def spark_empty(np):
    """A barrier stage of N tasks that do nothing: Spark's fixed cost per launch, alone."""
    sc = _Spark.get(np).sparkContext
    start = time.perf_counter()
    sc.parallelize(range(np), np).barrier().mapPartitions(_empty_task).collect()
    return time.perf_counter() - start


def floor_torch(np):
    """N bare processes with torch.distributed's env:// variables; rank 0 holds the store."""
    start = time.perf_counter()
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, HERE, "--child", "torch"],
                              env=dict(base_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                       RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(np)),
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              start_new_session=True)
             for r in range(np)]
    _wait_all(procs)
    return time.perf_counter() - start


class _Spark:
    """The one warm SparkSession every Spark launcher shares (hvd_magic's embedded one)."""
    session = None
    start_seconds = None

    @classmethod
    def get(cls, slots):
        if cls.session is None:
            from hvd_magic.launch.spark import embedded_session
            start = time.perf_counter()
            cls.session = embedded_session(slots)
            cls.session.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(
                lambda it: it).collect()
            cls.start_seconds = time.perf_counter() - start
        return cls.session


def hvd_magic_run(np, run_root, view=None, fresh=True, env=None):
    import hvd_magic
    start = time.perf_counter()
    run = hvd_magic.run(cell, np=np, run_dir=tempfile.mkdtemp(dir=run_root), view=view,
                        fresh=fresh, env=env)
    seconds = time.perf_counter() - start
    assert len(run.results) == abs(np)
    return seconds, run


def horovodrun(np, *extra):
    cmd = [os.path.join(BIN, "horovodrun"), "--gloo", "-np", str(np), *extra,
           sys.executable, HERE, "--child", "hvd"]
    start = time.perf_counter()
    run_cmd(cmd, env=base_env())
    return time.perf_counter() - start


def horovod_run_api(np):
    import horovod.runner
    start = time.perf_counter()
    results = horovod.runner.run(cell, np=np, use_gloo=True, verbose=0)
    seconds = time.perf_counter() - start
    assert len(results) == np
    return seconds


def torch_distributor(np, local_mode):
    from pyspark.ml.torch.distributor import TorchDistributor
    start = time.perf_counter()
    TorchDistributor(num_processes=np, local_mode=local_mode, use_gpu=False).run(torch_cell)
    return time.perf_counter() - start


def spark_then(fn, max_np):
    """`fn(np)` once the shared session is up, with max_np slots (a barrier stage over more
    slots than the session has waits ~10 min)."""
    def launch(np):
        _Spark.get(max_np)
        return fn(np)
    return launch


def launchers(run_root, max_np):
    """name -> function(np) -> seconds, in the order of the first repetition."""
    def on_spark(fn):
        return spark_then(fn, max_np)

    return {
        "floor": floor,
        "floor-torch": floor_torch,
        "spark-floor": on_spark(spark_floor),  # (the session first, with max_np slots: a
        "spark-empty-job": on_spark(spark_empty),  # barrier stage over the slots waits ~10 min)
        "hvd_magic-spark": on_spark(lambda np: hvd_magic_run(np, run_root)[0]),
        "hvd_magic-driver": lambda np: hvd_magic_run(-np, run_root)[0],
        # ranks forked from the host's template (hvd_magic.template), which the warm-up filled
        "hvd_magic-spark-fork": on_spark(lambda np: hvd_magic_run(np, run_root, fresh=False)[0]),
        "hvd_magic-driver-fork": lambda np: hvd_magic_run(-np, run_root, fresh=False)[0],
        "horovodrun": lambda np: horovodrun(np),
        "horovodrun-H": lambda np: horovodrun(np, "-H", f"localhost:{np}"),
        "horovodrun-c5": lambda np: horovodrun(np, "--cycle-time-ms", "5"),
        "horovod.run": horovod_run_api,
        "TD-barrier": on_spark(lambda np: torch_distributor(np, local_mode=False)),
        "TD-local": on_spark(lambda np: torch_distributor(np, local_mode=True)),
    }


# --- the profile ----------------------------------------------------------------------------

class _Clock:
    """A view that only notes when the driver handled each rank's events."""

    def __init__(self):
        self.events = []

    def start(self, run):
        self.events.append((time.time(), None, "view.start"))

    def event(self, run, rank, event):
        name = event.get("t")
        if name == "state":
            name = f"state:{event.get('state')}"
        self.events.append((time.time(), rank, name))

    def tick(self, run):
        pass

    def finish(self, run):
        self.events.append((time.time(), None, "view.finish"))


def profile_once(np, run_root):
    """One hvd_magic run's steps, as offsets from the call (medians across ranks where per rank)."""
    clock = _Clock()
    t0 = time.time()
    seconds, run = hvd_magic_run(np, run_root, view=clock)
    t_end = t0 + seconds
    first = {}
    for t, rank, name in clock.events:
        first.setdefault((rank, name), t)
    n = abs(np)
    marks = run.results

    def med(values):
        return statistics.median(values) - t0

    starting = [first[(r, "state:starting")] for r in range(n)]
    running = [first[(r, "state:running")] for r in range(n)]
    exits = [first[(r, "exit")] for r in range(n)]
    return {
        "run.started (pickled, launcher prepared, event server up)": run.started - t0,
        "task spawned its rank ('starting' received)": med(starting),
        "rank bootstrap done ('running' received)": med(running),
        "cell began": med([m["fn"] for m in marks]),
        "import torch, horovod.torch done": med([m["imported"] for m in marks]),
        "hvd.init() done": med([m["init"] for m in marks]),
        "allreduce done": med([m["allreduce"] for m in marks]),
        "rank's 'exit' received": med(exits),
        "last 'exit' received": max(exits) - t0,
        "run() returned": t_end - t0,
    }


def floor_profile(np):
    marks = []
    t0 = time.time()
    seconds = floor(np, marks)
    return {
        "cell began": statistics.median(m["fn"] for m in marks) - t0,
        "import torch, horovod.torch done": statistics.median(m["imported"] for m in marks) - t0,
        "hvd.init() done": statistics.median(m["init"] for m in marks) - t0,
        "allreduce done": statistics.median(m["allreduce"] for m in marks) - t0,
        "all processes exited": seconds,
    }


def _probe_task(_):
    """What a barrier task of hvd_magic does before it spawns its rank, with a mark per step."""
    import time
    marks = {"task function entered": time.time()}
    from pyspark import BarrierTaskContext
    import hvd_magic.task  # noqa: F401 (what unpickling hvd_magic's task function imports)
    marks["hvd_magic.task imported"] = time.time()
    ctx = BarrierTaskContext.get()
    server = None
    if ctx.partitionId() == 0:
        from horovod.runner.http.http_server import RendezvousServer
        server = RendezvousServer()
        server.start()
    marks["rendezvous server up (task 0)"] = time.time()
    ctx.allGather("port")
    marks["allGather done"] = time.time()
    ctx.barrier()
    marks["barrier done"] = time.time()
    if server is not None:
        server.stop()
    marks["rendezvous server stopped"] = time.time()
    yield marks


def spark_probe(np):
    """A bare barrier job of N tasks doing a task's steps (no rank): Spark's share of a launch."""
    sc = _Spark.get(np).sparkContext
    t0 = time.time()
    marks = sc.parallelize(range(np), np).barrier().mapPartitions(_probe_task).collect()
    returned = time.time()
    steps = {step: statistics.median(m[step] for m in marks) - t0 for step in marks[0]}
    steps["rendezvous server stopped"] = max(m["rendezvous server stopped"] for m in marks) - t0
    steps["collect() returned"] = returned - t0
    return steps


def profile(np, reps, run_root):
    """Median offsets of each step, for hvd_magic on Spark, driver-only, the floor, and a bare
    barrier job."""
    rows = {"hvd_magic-spark": [], "hvd_magic-driver": [], "floor": [], "Spark syncs alone": []}
    for _ in range(reps):
        rows["floor"].append(floor_profile(np))
        rows["hvd_magic-driver"].append(profile_once(-np, run_root))
        _Spark.get(np)
        rows["hvd_magic-spark"].append(profile_once(np, run_root))
        rows["Spark syncs alone"].append(spark_probe(np))
    return {name: {step: statistics.median(r[step] for r in runs) for step in runs[0]}
            for name, runs in rows.items()}


# --- the template's first cell and memory ----------------------------------------------------

def first_cells(nps, reps, run_root):
    """The first cell that imports torch, driver-only: forked from a new template (which imports
    torch and Horovod first, once) against fresh ranks, interleaved; each try gets a template of
    its own (the template's key includes HVD_MAGIC_TEMPLATE_IDLE, set to a new value each time)."""
    times = {"first-cell-fork": {np: [] for np in nps}, "first-cell-fresh": {np: [] for np in nps}}
    tries = iter(range(10**6))
    for rep in range(reps):
        for np in nps:
            for name in (("first-cell-fork", "first-cell-fresh") if rep % 2 == 0 else
                         ("first-cell-fresh", "first-cell-fork")):
                env = {"HVD_MAGIC_TEMPLATE_IDLE": str(60 + next(tries) / 1000)}
                seconds = hvd_magic_run(-np, run_root, fresh=name.endswith("fresh"), env=env)[0]
                times[name][np].append(seconds)
                print(f"  rep {rep} np={np} {name:17s} {seconds:6.2f} s", flush=True)
    return times


def template_memory():
    """(RSS, PSS) in MB of this process's driver-only template (None without one)."""
    from hvd_magic.template import client
    status = client.status()
    if not status:
        return None
    return status["rss"] / 2**20, status["pss"] / 2**20


# --- main -----------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", nargs="+", help="launcher names (default: all)")
    parser.add_argument("--skip", nargs="+", default=[], help="NAME or NAME@NP to leave out")
    parser.add_argument("--profile", type=int, default=0, metavar="REPS",
                        help="also profile hvd_magic's launch at np=2, REPS times")
    parser.add_argument("--first-cell", type=int, default=0, metavar="REPS",
                        help="also time the first cell on a new template against fresh ranks")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--child", choices=("hvd", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)

    import logging
    logging.getLogger("TorchDistributor").setLevel(logging.WARNING)
    run_root = tempfile.mkdtemp(prefix="bench_launch-")
    before = set(descendants())
    table = launchers(run_root, max(args.np))
    names = [n for n in table if not args.only or n in args.only]
    if any(n.startswith("TD-") for n in names):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            print("TorchDistributor needs pyarrow: .venv/bin/pip install -e '.[bench]'; skipped")
            names = [n for n in names if not n.startswith("TD-")]
    skip = set(args.skip)
    times = {n: {np: [] for np in args.np} for n in names}
    errors = {}
    loads = [os.getloadavg()]
    try:
        print(f"warm-up: each launcher once at np={min(args.np)}", flush=True)
        for name in names:
            try:
                table[name](min(args.np))
            except Exception as exc:  # reported, and the launcher is left out
                errors[name] = f"warm-up: {exc}"
                print(f"  {name}: {str(exc)[:300]}", flush=True)
        names = [n for n in names if n not in errors]
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for np in args.np:
                for name in order:
                    if name in skip or f"{name}@{np}" in skip or (name, np) in errors:
                        continue
                    try:
                        seconds = table[name](np)
                    except Exception as exc:
                        errors[(name, np)] = str(exc)[:500]
                        print(f"  rep {rep} np={np} {name}: FAILED {str(exc)[:300]}", flush=True)
                        continue
                    times[name][np].append(seconds)
                    print(f"  rep {rep} np={np} {name:17s} {seconds:6.2f} s", flush=True)
            loads.append(os.getloadavg())
        prof = profile(2, args.profile, run_root) if args.profile else None
        memory = template_memory()
        first = first_cells(args.np, args.first_cell, run_root) if args.first_cell else {}
        loads.append(os.getloadavg())
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
        clean_up(before)

    medians = {n: {np: statistics.median(v) for np, v in by_np.items() if v}
               for n, by_np in times.items()}
    print(f"\nlaunch, median seconds of {args.reps} (ratio to floor)")
    print(f"{'launcher':18s}" + "".join(f"{'np=' + str(np):>16s}" for np in args.np))
    for name in names:
        cells = []
        for np in args.np:
            m = medians[name].get(np)
            base = medians["floor"].get(np) if "floor" in medians else None
            cells.append("-" if m is None else f"{m:.2f} ({m / base:.2f}x)" if base else f"{m:.2f}")
        print(f"{name:18s}" + "".join(f"{c:>16s}" for c in cells))
    for name, by_np in first.items():
        print(f"{name:18s}" + "".join(f"{statistics.median(v):16.2f}" for v in by_np.values()))
    if memory:
        print(f"driver-only template: RSS {memory[0]:.0f} MB, PSS {memory[1]:.0f} MB")
    print(f"load average seen: {', '.join('%.1f' % la[0] for la in loads)}")
    if _Spark.start_seconds is not None:
        print(f"embedded Spark session start (cold, once): {_Spark.start_seconds:.1f} s")
    if prof:
        print(f"\nwhere a launch goes, np=2, median of {args.profile} (seconds since the call)")
        for name, steps in prof.items():
            print(f"  {name}")
            for step, t in steps.items():
                print(f"    {t:6.2f}  {step}")
    rows = rows_against("launch", times, "floor", reps=args.reps,
                        loads=[round(la[0], 2) for la in loads])
    for r in rows:
        if r["name"] in skip or f"{r['name']}@{r['np']}" in skip:
            r["skipped"] = True
    rows += [{"bench": "launch", "name": str(k), "np": None, "median": None, "best": None,
              "ratio": None, "error": v} for k, v in errors.items()]
    rows += rows_against("launch-first-cell", first, "first-cell-fresh", reps=args.first_cell,
                         loads=[round(la[0], 2) for la in loads]) if first else []
    if memory:
        rows += [row("launch-template-memory", f"driver-only template {kind}", None, [mb], unit="MB")
                 for kind, mb in zip(("RSS", "PSS"), memory)]
    if _Spark.start_seconds is not None:
        rows.append(row("launch-spark-start", f"embedded Spark session start, local[{max(args.np)}]",
                        None, [_Spark.start_seconds]))
    for column, steps in (prof or {}).items():
        rows += [row("launch-profile", step, 2, [t], column=column, reps=args.profile)
                 for step, t in steps.items()]
    write(args.json, rows)

if __name__ == "__main__":
    sys.exit(main())
