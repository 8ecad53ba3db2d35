"""Elastic runs: recovery from a killed rank (hvd_magic driver-only beside horovodrun), and what
an elastic run costs when nothing fails.

**Recovery** (``--part recovery``).
The same Horovod elastic PyTorch loop (`elastic_loop`: TorchState, a commit every 10 steps) runs
on 3 ranks with ``--min-np 2``, once under ``hvd_magic.run(..., np=-3, min_np=2)`` and once under
``horovodrun --gloo -np 3 --min-np 2 --max-np 3 --host-discovery-script D`` (D names three "hosts"
of this machine: ``localhost``, ``127.0.0.1`` and its own address, one slot each, because Horovod
blacklists a failed worker's host). Every rank appends ``time pid step size`` to a file per step;
when the ring reaches step `--kill-at`, this script SIGKILLs the rank process that was rank 1 at
the start (its pid, from the file it wrote), and reads from the file:

- **recovery**: seconds from the kill to the first step a survivor took after it (the Gloo
  timeout, the same for both: ``HOROVOD_GLOO_TIMEOUT_SECONDS``, dominates);
- **redone**: steps the survivors took again (the last step before the kill less the step they
  went on from);
- whether the run ended at the last step, and the ring's size then (hvd_magic replaces the lost
  rank, horovodrun does not: its host stays blacklisted).

**Cost** (``--part cost``): the steps/s of rank 0 in a run where nothing fails, driver-only on 3
ranks, interleaved (the order alternates each repetition):

- ``barrier``: ``hvd_magic.run(cost_loop, np=-3)`` with a plain Horovod loop (the reference);
- ``barrier, elastic API, commit every K``: the same launch, the loop written against the elastic
  API (``@hvd.elastic.run``, ``TorchState``, ``state.commit()`` every K steps, the first of
  ``--commit-every``): what the API itself costs;
- ``elastic, commit every K``: that loop with ``min_np=2`` (Horovod's elastic driver and its
  rendezvous as well), for each K of ``--commit-every``.

Each is the same step (bench_training.py's MLP, one synthetic batch of 32, one intra-op thread),
clocked inside the rank after ``--cost-warmup`` steps and a common allreduce: start-up is not
counted. Beside the rates, rank 0's median milliseconds per ``state.commit()`` (``commit_ms``) and
per ``state.save()`` alone (``save_ms``, timed after the clock stopped), and the share of the
timed loop spent in commits (``commit_share``: within one run, so the machine's load, which varies
from run to run, weighs less on it than on the ratio of two runs' rates; rank 0 waiting in a
commit's broadcast for a slower rank is counted, a wait the next step would have had otherwise, so
it leans high); ``paired_ratio``, the median over the repetitions of a run's rate over the barrier
run's of the same repetition, for the same reason. A commit is a save (copies of the model's and optimizer's state) and
``check_host_updates()``, a ``broadcast_object`` from rank 0 (two broadcasts, each a negotiation
round of Horovod's background loop, like a step's).

    .venv/bin/python bench/bench_elastic.py [--part recovery cost] [--reps 1] [--steps 300]
        [--kill-at 105] [--cost-steps 600] [--cost-reps 5] [--commit-every 10 100]

Not a test: numbers live here only.
"""

import argparse
import json
import os
import signal
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
import time

from rows import row, write

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
NP, MIN_NP = 3, 2


def elastic_loop(folder, steps, commit_every=10, pause=0.02):
    """The training both launchers run: a Horovod elastic loop that logs every step."""
    import os
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    with open(os.path.join(folder, f"pid-{hvd.rank()}"), "w") as f:
        f.write(str(os.getpid()))
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    log = os.path.join(folder, "steps.log")

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            optimizer.zero_grad()
            model(torch.randn(16, 32)).pow(2).mean().backward()
            optimizer.step()
            state.step += 1
            with open(log, "a") as f:
                f.write(f"{time.time()} {os.getpid()} {state.step} {hvd.size()}\n")
            if state.step % commit_every == 0:
                state.commit()
            time.sleep(pause)

    train(state)
    return state.step


def cost_loop(steps, warmup, commit_every=None):
    """This rank's steps/s over `steps` steps of a small MLP: a plain loop, or (`commit_every`)
    one written against Horovod's elastic API; and what its commits took."""
    import statistics
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # ranks share 2 cores: no intra-op threads fighting them
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    commits, cpu = [], []

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    def timed(after_step):
        for _ in range(warmup):
            step()
        hvd.allreduce(torch.zeros(1), name="start")  # every rank starts the clock together
        start, cpu0 = time.perf_counter(), time.process_time()
        for i in range(1, steps + 1):
            step()
            after_step(i)
        cpu.append(1000 * (time.process_time() - cpu0) / steps)  # all its threads, per step
        return time.perf_counter() - start

    if commit_every is None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        rate = steps / timed(lambda i: None)
        return {"rank": hvd.rank(), "steps_per_s": rate, "cpu_ms_per_step": cpu[-1]}
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    def commit(i):
        state.step = i
        if i % commit_every == 0:
            began = time.perf_counter()
            state.commit()
            commits.append(time.perf_counter() - began)

    @hvd.elastic.run
    def train(state):  # (its first state.sync() is the broadcast of the plain loop)
        return timed(commit)

    wall = train(state)
    # A commit is state.save() (copies of the model's and the optimizer's state) and
    # check_host_updates() (a broadcast_object from rank 0: two broadcasts): the copies alone,
    # after the clock stopped, tell the two apart.
    saves = []
    for _ in range(20):
        began = time.perf_counter()
        state.save()
        saves.append(time.perf_counter() - began)
    return {"rank": hvd.rank(), "steps_per_s": steps / wall, "cpu_ms_per_step": cpu[-1],
            "commit_share": sum(commits) / wall,
            "commit_ms": 1000 * statistics.median(commits), "save_ms": 1000 * statistics.median(saves)}


def _cost_runs(commit_every, where):
    """name -> (np, min_np, commit_every): the reference, the API without the elastic launch,
    and elastic runs committing every `commit_every` steps (each value); on the driver, and on
    Spark if `where` says so (a Spark barrier stage, and plain tasks for the elastic runs)."""
    runs = {}
    for place, np, prefix in (("driver", -NP, ""), ("spark", NP, "Spark ")):
        if place in where:
            runs[f"{prefix}barrier"] = (np, None, None)
            runs[f"{prefix}barrier, elastic API, commit every {commit_every[0]}"] = (
                np, None, commit_every[0])
            runs.update({f"{prefix}elastic, commit every {k}": (np, MIN_NP, k)
                         for k in commit_every})
    return runs


def run_cost(np, min_np, commit_every, args):
    import hvd_magic
    from hvd_magic.view import TextView

    run = hvd_magic.run(cost_loop, np=np, min_np=min_np, view=TextView(quiet=True),
                        args=(args.cost_steps, args.cost_warmup, commit_every))
    # (results are in hvd_magic's slot order; Horovod may number an elastic run's ranks otherwise)
    return next(r for r in run.results if r["rank"] == 0)


def measure_cost(args):
    runs = _cost_runs(args.commit_every, args.where)
    seen = {name: [] for name in runs}
    for rep in range(args.cost_reps):  # interleaved, the order alternating
        for name in (list(runs) if rep % 2 == 0 else list(reversed(runs))):
            seen[name].append(run_cost(*runs[name], args))
            print(f"cost: {name}: {json.dumps(seen[name][-1])}", flush=True)
    rows = []
    for name, outcomes in seen.items():
        # each beside the barrier run of its own place (the driver's, or Spark's)
        barrier = "Spark barrier" if name.startswith("Spark") else "barrier"
        ref = statistics.median(o["steps_per_s"] for o in seen[barrier])
        extra = {}
        if runs[name][2] is not None:  # rank 0's commits, the median of the runs' figures
            extra = {k: statistics.median(o[k] for o in outcomes)
                     for k in ("commit_ms", "save_ms", "commit_share")}
            extra["commit_every"] = runs[name][2]
        extra["cpu_ms_per_step"] = statistics.median(o["cpu_ms_per_step"] for o in outcomes)
        # each run over the barrier run of its own repetition (seconds apart, so under much the
        # same load: on a shared machine the load drifts over minutes, from run to run)
        extra["paired_ratio"] = statistics.median(
            o["steps_per_s"] / b["steps_per_s"] for o, b in zip(outcomes, seen[barrier]))
        r = row("elastic-cost", name, NP, [o["steps_per_s"] for o in outcomes], unit="steps/s",
                better="higher", ref=ref, reference=barrier, reps=args.cost_reps,
                steps=args.cost_steps, **extra)
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def _steps(folder):
    try:
        with open(os.path.join(folder, "steps.log")) as f:
            return [(float(t), int(p), int(s), int(n)) for t, p, s, n in
                    (line.split() for line in f if line.count(" ") == 3)]
    except OSError:
        return []


def _kill_at(folder, kill_at, alive, timeout=180):
    """SIGKILL the first rank 1 once the ring reached `kill_at`; the kill's time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        if any(s >= kill_at for _, _, s, _ in _steps(folder)):
            with open(os.path.join(folder, "pid-1")) as f:
                pid = int(f.read())
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            return killed, pid
        time.sleep(0.02)
    raise RuntimeError("the run never reached the step to kill at")


def _measure(folder, killed, pid, steps):
    lines = _steps(folder)
    before = max(s for t, _, s, _ in lines if t <= killed)
    # the first step in the smaller ring (a step in flight at the kill may be logged just after)
    after = [(t, s, n) for t, p, s, n in lines if t > killed and p != pid and n < NP]
    first_t, first_s, _ = min(after)
    last = max(lines, key=lambda x: x[2])
    return {"recovery": first_t - killed, "redone": before - (first_s - 1),
            "finished": last[2] == steps, "final_size": last[3], "killed_after": before,
            "went_on_from": first_s - 1}


def run_hvd_magic(folder, steps, kill_at, env, np=-NP):
    import hvd_magic
    from hvd_magic.view import TextView

    run = hvd_magic.run(elastic_loop, np=np, min_np=MIN_NP, args=(folder, steps),
                        background=True, view=TextView(quiet=True), horovod_env=env)
    try:
        killed, pid = _kill_at(folder, kill_at, lambda: run.state == "running")
        run.wait(300)
    finally:
        if run.state == "running":
            run.cancel()
    return _measure(folder, killed, pid, steps)


def _discovery_script(folder):
    own = socket.gethostbyname(socket.gethostname())
    if own.startswith("127."):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            own = s.getsockname()[0]
    path = os.path.join(folder, "discover.sh")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\necho {own}:1\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def run_horovodrun(folder, steps, kill_at, env):
    script = os.path.join(folder, "train.py")
    with open(script, "w") as f:
        f.write(f"import sys\nsys.path.insert(0, {HERE!r})\nfrom bench_elastic import elastic_loop\n"
                f"elastic_loop({folder!r}, {steps})\n")
    cmd = [os.path.join(BIN, "horovodrun"), "--gloo", "-np", str(NP), "--min-np", str(MIN_NP),
           "--max-np", str(NP), "--host-discovery-script", _discovery_script(folder),
           sys.executable, script]
    proc = subprocess.Popen(cmd, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        killed, pid = _kill_at(folder, kill_at, lambda: proc.poll() is None)
        proc.wait(300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return _measure(folder, killed, pid, steps)


def measure_recovery(args, env):
    launchers = {"horovodrun": run_horovodrun, "hvd_magic": run_hvd_magic}
    if "spark" in args.where:  # the same ranks as plain tasks of an embedded local[4] session
        launchers["hvd_magic on Spark"] = lambda *a: run_hvd_magic(*a, np=NP)
    seen = {name: [] for name in launchers}
    for _ in range(args.reps):  # interleaved: the machine's load falls on all alike
        for name, launch in launchers.items():
            with tempfile.TemporaryDirectory(prefix="bench-elastic-") as folder:
                seen[name].append(launch(folder, args.steps, args.kill_at, env))
            print(name, json.dumps(seen[name][-1]), flush=True)
    ref = None
    rows = []
    for name in launchers:
        outcomes = seen[name]
        r = row("elastic", f"recovery after SIGKILL, {name}", NP,
                [o["recovery"] for o in outcomes], ref=ref, reference="horovodrun",
                redone=[o["redone"] for o in outcomes],
                finished=all(o["finished"] for o in outcomes),
                final_size=[o["final_size"] for o in outcomes], gloo_timeout=args.gloo_timeout)
        ref = ref or r["median"]
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", choices=("recovery", "cost"),
                        default=["recovery", "cost"])
    parser.add_argument("--reps", type=int, default=1, help="recovery: runs of each launcher")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kill-at", type=int, default=105)  # half-way to a commit
    parser.add_argument("--gloo-timeout", type=int, default=10,
                        help="recovery: HOROVOD_GLOO_TIMEOUT_SECONDS of both launchers")
    parser.add_argument("--cost-steps", type=int, default=600, help="cost: steps timed per run")
    parser.add_argument("--cost-warmup", type=int, default=20)
    parser.add_argument("--cost-reps", type=int, default=5, help="cost: runs of each")
    parser.add_argument("--commit-every", type=int, nargs="+", default=[10, 100],
                        help="cost: an elastic run for each (the first also in a barrier run)")
    parser.add_argument("--where", nargs="+", choices=("driver", "spark"),
                        default=["driver", "spark"],
                        help="hvd_magic's ranks on the driver (-np) and/or on Spark (local[4])")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(args.gloo_timeout)}
    rows = []
    if "recovery" in args.part:
        rows += measure_recovery(args, env)
    if "cost" in args.part:
        rows += measure_cost(args)  # (hvd_magic's Gloo timeout: nothing fails, and a short one
        # can fail hvd.init() itself on a loaded machine)
    write(args.json, rows)


if __name__ == "__main__":
    main()
