"""Elastic torch.distributed without Horovod (`hvd_magic.elastic`, issue #53): recovery from a
killed rank on the driver and on Spark beside torchrun's restart of every worker, and what an
elastic run costs when nothing fails.

The machine has 2 cores and is shared (other suites may run on it meanwhile): what is compared
is interleaved (each repetition runs every launcher once, the order alternating), and the rows
give medians and the best of the repetitions.

Every rank trains bench_training.py's MLP (64-256-256-10, one synthetic batch of 32 rows per
step, one intra-op thread) wrapped in ``DistributedDataParallel`` over Gloo.

**Recovery** (``--part recovery``). 3 ranks, ``min_np=2``, a commit (or checkpoint) every 10
steps, a ``--pause`` after each step (as bench_elastic.py's loop):

- ``hvd_magic``: `elastic_ddp_loop` (``elastic.TorchState``, ``@elastic.run``,
  ``state.commit()``) under ``hvd_magic.run(fn, np=-3, min_np=2)``;
- ``hvd_magic on Spark``: the same with ``np=3`` (each slot a plain task of the embedded
  ``local[4]`` session hvd_magic starts);
- ``torchrun``: `checkpointed_loop`, the torchrun user's way (rank 0 ``torch.save``-s model,
  optimizer and step every 10 steps; every worker loads that checkpoint at its start) under
  ``torchrun --standalone --nnodes=1 --nproc-per-node=3 --max-restarts=3`` (on one node, its
  elastic agent stops every worker when one fails and starts them all again), with
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: without it (torch 2.13) the restarted workers read
  the killed attempt's Gloo addresses from the agent's store (Connection refused), and the
  restart after that hangs in ``connectFullMesh``.

Every rank appends ``time pid step world_size`` to a file per step; when a rank logged step
`--kill-at`, this script SIGKILLs the process that was rank 1 at the start (its pid, from the
file it wrote) and reads from the file:

- **recovery**: seconds from the kill to the first step completed after it in a smaller world
  or by a process started after the kill (a step in flight at the kill, logged just after it by
  a survivor of the old world, does not count);
- **redone**: steps taken again (the last step before the kill less the step it went on from);
- whether the run ended at the last step, and the world's size then (hvd_magic's replacement
  joins at a later commit; torchrun's restart is 3 workers again).

A row has the median recovery and the ``worst`` (the issue's target: hvd_magic ≤ 1 s every
time), the most steps ``redone``, and where the seconds went, from the kill (medians; each
repetition's in ``*_each``): for hvd_magic, from the run folder's events.jsonl (``run_dirs``),
when the driver heard of the loss (``lost_after``) and formed the world of 2 (``ring_after``);
for torchrun, when the first restarted worker started (``started_after``), had imported torch
(``imported_after``) and had made its process group (``group_after``).

**Cost** (``--part cost``): rank 0's steps/s when nothing fails, 3 ranks on the driver,
interleaved (the order alternates each repetition):

- ``plain``: `cost_loop` as a plain DDP loop under ``hvd_magic.run(fn, np=-3)`` (the reference);
- ``elastic API, commit every K``: the loop written with `hvd_magic.elastic` (the first K of
  ``--commit-every``) under the same plain launch (``run`` then calls it once): the API alone;
- ``elastic, commit every K``: that loop with ``min_np=2`` (our membership, the rank's world
  helper), for each K of ``--commit-every``.

Each is clocked inside the rank, between two barriers, after ``--cost-warmup`` steps (start-up
is not counted); one plain run before the repetitions is not counted (the first of a process
starts cold). ``paired_ratio`` is the median over the repetitions of a run's rate over the
plain run's of the same repetition (seconds apart, so under much the same load); ``commit_ms``
rank 0's median milliseconds per ``state.commit()`` (a copy of the model's and the optimizer's
state, and a look at the driver's word: no collective), ``commit_share`` the share of the timed
loop spent in commits.

    .venv/bin/python bench/bench_elastic_ddp.py [--part recovery cost] [--reps 3]
        [--where driver spark] [--steps 300] [--kill-at 105] [--cost-reps 5]
        [--cost-steps 600] [--commit-every 10 100] [--json PATH]

Not a test: numbers live here only.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench_elastic import _kill_at, _steps  # (the same files, the same kill)
from rows import row, write

HERE = os.path.abspath(__file__)
BIN = os.path.dirname(sys.executable)
NP, MIN_NP = 3, 2


# --- what every rank runs -----------------------------------------------------------------------

def _mlp():
    """bench_training.py's model and batch, one intra-op thread (ranks share 2 cores)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, optimizer, torch.randn(32, 64), torch.randint(0, 10, (32,))


def _step(ddp, optimizer, x, y):
    import torch

    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    optimizer.step()


def _log_step(folder, step):
    import torch.distributed as dist

    with open(os.path.join(folder, "steps.log"), "a") as f:
        f.write(f"{time.time()} {os.getpid()} {step} {dist.get_world_size()}\n")


def _say_pid(folder):
    import torch.distributed as dist

    with open(os.path.join(folder, f"pid-{dist.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))


def _phase(folder, what):
    """When a torchrun worker got where (`phases.log`: where a restart's seconds go)."""
    with open(os.path.join(folder, "phases.log"), "a") as f:
        f.write(f"{time.time()} {os.getpid()} {what}\n")


def elastic_ddp_loop(folder, steps, commit_every=10, pause=0.02):
    """The recovery run under hvd_magic: a DDP loop written with hvd_magic.elastic."""
    import time

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hvd_magic import elastic

    dist.init_process_group("gloo")
    _say_pid(folder)
    model, optimizer, x, y = _mlp()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @elastic.run
    def train(state):
        ddp = DDP(state.model)  # bound to this world's group: made again in each
        while state.step < steps:
            _step(ddp, optimizer, x, y)
            state.step += 1
            _log_step(folder, state.step)
            if state.step % commit_every == 0:
                state.commit()
            time.sleep(pause)
        return state.step

    return train(state)


def checkpointed_loop(folder, steps, commit_every=10, pause=0.02):
    """The recovery run under torchrun: the same DDP loop, a checkpoint file instead of commits
    (rank 0 saves every `commit_every` steps; every worker starts from the latest)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    _phase(folder, "imported")
    dist.init_process_group("gloo")
    _phase(folder, "group")
    _say_pid(folder)
    model, optimizer, x, y = _mlp()
    path, step = os.path.join(folder, "checkpoint.pt"), 0
    if os.path.exists(path):
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    ddp = DDP(model)
    while step < steps:
        _step(ddp, optimizer, x, y)
        step += 1
        _log_step(folder, step)
        if step % commit_every == 0 and dist.get_rank() == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step}, path + ".tmp")
            os.replace(path + ".tmp", path)  # a kill mid-save leaves the last one whole
        time.sleep(pause)
    dist.barrier()
    dist.destroy_process_group()


def cost_loop(steps, warmup, commit_every=None):
    """Rank 0's steps/s over `steps` DDP steps: a plain loop, or (`commit_every`) one written
    with hvd_magic.elastic; and what its commits took."""
    import statistics
    import time

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hvd_magic import elastic

    dist.init_process_group("gloo")
    model, optimizer, x, y = _mlp()
    commits = []

    def timed(ddp, after_step):
        for _ in range(warmup):
            _step(ddp, optimizer, x, y)
        dist.barrier()  # every rank starts the clock together
        start, cpu0 = time.perf_counter(), time.process_time()
        for i in range(1, steps + 1):
            _step(ddp, optimizer, x, y)
            after_step(i)
        dist.barrier()
        wall = time.perf_counter() - start
        return wall, 1000 * (time.process_time() - cpu0) / steps

    if commit_every is None:
        wall, cpu = timed(DDP(model), lambda i: None)
        return {"rank": dist.get_rank(), "steps_per_s": steps / wall, "cpu_ms_per_step": cpu}
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

    def commit(i):
        state.step = i
        if i % commit_every == 0:
            began = time.perf_counter()
            state.commit()
            commits.append(time.perf_counter() - began)

    @elastic.run
    def train(state):
        return timed(DDP(state.model), commit)

    wall, cpu = train(state)
    return {"rank": dist.get_rank(), "steps_per_s": steps / wall, "cpu_ms_per_step": cpu,
            "commit_share": sum(commits) / wall, "commit_ms": 1000 * statistics.median(commits)}


# --- recovery -------------------------------------------------------------------------------------

def _measure(folder, killed, pid, steps):
    lines = _steps(folder)
    before = max(s for t, _, s, _ in lines if t <= killed)
    old = {p for t, p, _, _ in lines if t <= killed}
    # the first step that went on: in a smaller world, or by a process started after the kill
    after = [(t, s) for t, p, s, n in lines if t > killed and p != pid and (n < NP or p not in old)]
    first_t, first_s = min(after)
    last = max(lines, key=lambda x: (x[2], x[0]))
    return {"recovery": first_t - killed, "redone": before - (first_s - 1),
            "finished": last[2] == steps, "final_size": last[3], "killed_after": before,
            "went_on_from": first_s - 1}


def _membership(run_dir, killed):
    """From hvd_magic's events.jsonl: seconds from the kill to the driver's `lost` and to the
    next world (`ring`), and the sizes of the worlds."""
    events = []
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            if e.get("t") in ("lost", "ring"):
                events.append(e)
    lost = next((e for e in events if e["t"] == "lost"), None)
    ring = next((e for e in events if e["t"] == "ring" and lost and e["time"] >= lost["time"]),
                None)
    return {"lost_after": lost and lost["time"] - killed, "ring_after": ring and ring["time"] - killed,
            "rings": [e["size"] for e in events if e["t"] == "ring"], "run_dir": run_dir}


def run_hvd_magic(folder, args, np=-NP):
    import hvd_magic
    from hvd_magic.view import TextView

    run = hvd_magic.run(elastic_ddp_loop, np=np, min_np=MIN_NP,
                        args=(folder, args.steps, args.commit_every[0], args.pause),
                        background=True, view=TextView(quiet=True))
    try:
        killed, pid = _kill_at(folder, args.kill_at, lambda: run.state == "running")
        run.wait(300)
    finally:
        if run.state == "running":
            run.cancel()
    return dict(_measure(folder, killed, pid, args.steps), **_membership(run.run_dir, killed))


def run_torchrun(folder, args):
    cmd = [os.path.join(BIN, "torchrun"), "--standalone", "--nnodes=1", f"--nproc-per-node={NP}",
           "--max-restarts=3", HERE, "--child", folder, str(args.steps),
           str(args.commit_every[0]), str(args.pause)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "HVD_MAGIC_"))}
    # (torch 2.13's default, workers sharing the agent's store, hangs every restart of a Gloo
    # group: the restarted workers read the killed attempt's addresses from that store, fail to
    # connect, and the next restart waits in connectFullMesh. A store of their own each attempt:)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    with open(os.path.join(folder, "torchrun.log"), "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            killed, pid = _kill_at(folder, args.kill_at, lambda: proc.poll() is None)
            proc.wait(300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode != 0:
        with open(os.path.join(folder, "torchrun.log")) as f:
            raise RuntimeError(f"torchrun exited {proc.returncode}: {f.read()[-3000:]}")
    return dict(_measure(folder, killed, pid, args.steps), **_phases(folder, killed))


def _phases(folder, killed):
    """Seconds from the kill to the first restarted worker's start, its torch imported, and
    its process group made."""
    firsts = {}
    with open(os.path.join(folder, "phases.log")) as f:
        for t, _, what in (line.split() for line in f):
            if float(t) > killed:
                firsts.setdefault(what, float(t) - killed)
    return {f"{what}_after": firsts.get(what) for what in ("started", "imported", "group")}


def measure_recovery(args):
    launchers = {"torchrun": run_torchrun}
    if "driver" in args.where:
        launchers["hvd_magic"] = run_hvd_magic
    if "spark" in args.where:
        launchers["hvd_magic on Spark"] = lambda *a: run_hvd_magic(*a, np=NP)
    seen = {name: [] for name in launchers}
    for rep in range(args.reps):  # interleaved, the order alternating
        for name in (list(launchers) if rep % 2 == 0 else list(reversed(launchers))):
            with tempfile.TemporaryDirectory(prefix="bench-elastic-ddp-") as folder:
                seen[name].append(launchers[name](folder, args))
            print(f"recovery: {name}: {json.dumps(seen[name][-1])}", flush=True)
    ref = statistics.median(o["recovery"] for o in seen["torchrun"])
    rows = []
    for name, outcomes in seen.items():
        # each repetition's figures as lists (`*_each`); medians and the worst as single
        # values, which BENCHMARKS.md's table of a row's own fields shows
        keys = ("started_after", "imported_after", "group_after", "lost_after", "ring_after")
        extra = {}
        for k in keys:
            each = [o.get(k) for o in outcomes]
            extra[k] = statistics.median(each) if None not in each else None
            extra[f"{k}_each"] = each
        r = row("elastic-ddp", f"recovery after SIGKILL, {name}", NP,
                [o["recovery"] for o in outcomes], ref=ref, reference="torchrun",
                worst=max(o["recovery"] for o in outcomes),
                redone=max(o["redone"] for o in outcomes),
                redone_each=[o["redone"] for o in outcomes],
                finished=all(o["finished"] for o in outcomes),
                final_size_each=[o["final_size"] for o in outcomes],
                worlds_each=[o.get("rings") for o in outcomes],
                run_dirs=[o.get("run_dir") for o in outcomes],
                commit_every=args.commit_every[0], kill_at=args.kill_at, **extra)
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


# --- cost -----------------------------------------------------------------------------------------

def run_cost(min_np, commit_every, args):
    import hvd_magic
    from hvd_magic.view import TextView

    run = hvd_magic.run(cost_loop, np=-NP, min_np=min_np, view=TextView(quiet=True),
                        args=(args.cost_steps, args.cost_warmup, commit_every))
    return next(r for r in run.results if r["rank"] == 0)


def measure_cost(args):
    first = args.commit_every[0]
    runs = {"plain": (None, None), f"elastic API, commit every {first}": (None, first)}
    runs.update({f"elastic, commit every {k}": (MIN_NP, k) for k in args.commit_every})
    seen = {name: [] for name in runs}
    run_cost(*runs["plain"], args)  # not counted: the first run of a process starts cold
    for rep in range(args.cost_reps):  # interleaved, the order alternating
        for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
            seen[name].append(run_cost(*runs[name], args))
            print(f"cost: {name}: {json.dumps(seen[name][-1])}", flush=True)
    ref = statistics.median(o["steps_per_s"] for o in seen["plain"])
    rows = []
    for name, outcomes in seen.items():
        extra = {}
        if runs[name][1] is not None:
            extra = {k: statistics.median(o[k] for o in outcomes)
                     for k in ("commit_ms", "commit_share")}
            extra["commit_every"] = runs[name][1]
        extra["min_np"] = runs[name][0]
        extra["cpu_ms_per_step"] = statistics.median(o["cpu_ms_per_step"] for o in outcomes)
        extra["paired_ratio"] = statistics.median(
            o["steps_per_s"] / p["steps_per_s"] for o, p in zip(outcomes, seen["plain"]))
        r = row("elastic-ddp-cost", name, NP, [o["steps_per_s"] for o in outcomes],
                unit="steps/s", better="higher", ref=ref, reference="plain",
                reps=args.cost_reps, steps=args.cost_steps, **extra)
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def child(folder, steps, commit_every, pause):
    """A torchrun worker."""
    _phase(folder, "started")
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a worker waits, if it hangs
    checkpointed_loop(folder, int(steps), int(commit_every), float(pause))
    sys.stdout.flush()
    os._exit(0)  # as hvd_magic's rank ends: no interpreter teardown with torch loaded


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(*sys.argv[2:6])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", choices=("recovery", "cost"),
                        default=["recovery", "cost"])
    parser.add_argument("--reps", type=int, default=3, help="recovery: runs of each launcher")
    parser.add_argument("--where", nargs="+", choices=("driver", "spark"),
                        default=["driver", "spark"], help="recovery: hvd_magic's ranks where")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kill-at", type=int, default=105)  # half-way to a commit
    parser.add_argument("--pause", type=float, default=0.02, help="recovery: seconds after a step")
    parser.add_argument("--cost-steps", type=int, default=600, help="cost: steps timed per run")
    parser.add_argument("--cost-warmup", type=int, default=20)
    parser.add_argument("--cost-reps", type=int, default=5, help="cost: runs of each")
    parser.add_argument("--commit-every", type=int, nargs="+", default=[10, 100],
                        help="recovery: the first; cost: an elastic run for each")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    if "recovery" in args.part:
        rows += measure_recovery(args)
    if "cost" in args.part:
        rows += measure_cost(args)
    write(args.json, rows)


if __name__ == "__main__":
    main()
