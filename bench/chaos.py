"""Faults at random: rounds of runs, each with a fault at a random moment, and what every round
must show, checked here (not by eye).

A round is drawn from its seed: a launcher (``--np -3`` on the driver, ``--np 3`` on a local
Spark session or on a standalone cluster of two workers), a program (a DDP loop; an elastic DDP
loop written with `hvd_magic.elastic`; a Horovod loop; a Lightning fit, of four ranks on the
cluster, two a host; the Horovod loop as a cell of a warm session started for the round), a
fault and its moment (after a random step of a random rank, or as soon as the rank's process
exists: in its imports or in ``init_process_group``/``hvd.init()``):

- kill: the rank SIGKILLed; freeze: the rank stopped (SIGSTOP) under ``--timeout``; cancel: the
  run cancelled; task: the rank's Spark task (the Python worker that runs it) SIGKILLed; oom: the
  rank moved into a memory cgroup of 160 MB and made to grow past it; notebook: the notebook that
  started the run (an IPython shell in a process of its own; on the cluster, an application of
  its own there) SIGKILLed; worker: the cluster's
  worker that runs the rank SIGKILLed with its executor (started again at once for an elastic
  run, after the round for the others); executor: its executor's JVM SIGKILLed (the worker
  starts another); cut: the cluster's two simulated hosts (network namespaces) cut apart for
  3-20 s, then joined again; interrupt: the run cancelled in a rank's start (before its first
  step: its imports, its framework's init); none.

Every fault is drawn with every program (freeze x elastic included: the frozen member must be
given up and the run go on); a share of rounds (``--neighbours``) runs beside a second notebook
(chaos_neighbour.py). What a round must show, once its fault struck (chaos_faults.py: a round
whose fault never happened is reported apart and counts as nothing; a cut without network
namespaces is refused):

- **ends**: within a deadline derived from its options, or the round counts a hang; and from
  its fault to its error (or an elastic run's world formed again) within the fault's bound;
- **names its cause**: killed → a `RankError` naming the rank and SIGKILL; out of memory → a
  `RankError` naming the rank and "out of memory"; its task killed → a `LaunchError` naming the
  rank and its Spark task; frozen → `RunTimeout`; cancelled → `RunCancelled`; none → done. An
  elastic run that loses a rank (killed, frozen, out of memory, its task, its worker): no error,
  the survivors and the replacement end with equal weights (or, where the ranks lost were every
  rank it had, an error saying so); a lost worker → an error naming one of its ranks and their
  executor;
- **a session stays usable or says so**: the session's next cell runs on every rank, or is
  refused with "%horovod_session restart"; then it is stopped;
- **leaves nothing behind** (chaos_leaks.py, a column each, found by what the round recorded):
  processes, rank folders, value files, the shipped cache's partial folders, cgroups, Spark
  jobs and JVMs, ports;
- **keeps every log**: the run folder has a log for every rank (a killed notebook's: every rank
  that had reported a step);
- **leaves the other notebook alone**: its ranks live on and its run ends as its own.

A failing round prints its seed: ``--seed S --only R`` replays it; ``--replay FILE`` plays again
the rounds a soak printed there (a line of JSON a round), as they were drawn, also after the
harness has changed what a seed draws.

    .venv/bin/python bench/chaos.py [--rounds 40] [--seed 1] [--launchers driver spark]
                                    [--programs ddp elastic horovod]
                                    [--faults kill freeze cancel task oom notebook none]
                                    [--neighbours 0.25] [--out bench/soak/NAME.jsonl.gz]
    .venv/bin/python bench/chaos.py --soak 1000 --seed S --out bench/soak/NAME.jsonl.gz
                                    # (every pair in turn until 1000 counted; resumable)
    .venv/bin/python bench/chaos.py --table [--write RELIABILITY.md]  # from bench/soak/

The suite runs a short seeded slice (tests/test_chaos.py); the long soak stays here.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_faults  # noqa: E402
import chaos_leaks as leaks  # noqa: E402
import chaos_table  # noqa: E402
from chaos_cluster import CLUSTER  # noqa: E402
from chaos_leaks import _alive, _command, _named  # noqa: E402
from chaos_neighbour import Neighbour  # noqa: E402
import chaos_soak  # noqa: E402

NP = 3
# Steps of a run: past the latest moment drawn (step 25) by 15 steps, so that a fault there
# finds the run going (60 before: 20 more steps a round that changed no check)
STEPS = 40
TIMEOUT = 20          # --timeout of a round whose rank is frozen (seconds)
MOMENTS = ("init", "early", "late")  # the suite's slice: in the rank's start, steps 1-5, 20-28
# A notebook value past the broadcast limit (4 MB): it goes to the ranks as a value file
# (/dev/shm), which every round then looks for after its end
BALLAST = b"\0" * (5 << 20)

DDP = """\
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import hvd_magic
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    hvd_magic.report(step=step + 1, total=steps)
    time.sleep(0.03)
    {told}
dist.get_rank()
"""

ELASTIC = """\
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import hvd_magic
from hvd_magic import elastic
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

@elastic.run
def train(state):
    ddp = DDP(state.model)
    while state.step < steps:
        optimizer.zero_grad()
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(state.step))
        ddp(x).sum().backward()
        optimizer.step()
        state.step += 1
        if state.step % 5 == 0:
            state.commit()
        hvd_magic.report(step=state.step, total=steps)
        time.sleep(0.03)
        {told}

train(state)
torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
"""

HOROVOD = """\
import time, torch
import horovod.torch as hvd
import hvd_magic
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for step in range(steps):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    hvd_magic.report(step=step + 1, total=steps)
    time.sleep(0.03)
    {told}
hvd.rank()
"""

# What a rank does when the harness tells it (the oom fault): a file named by its pid in the
# round's folder `told` says "hold" (it stops stepping: its peers wait in their next collective),
# then "grow" (32 MB more every 50 ms, until its memory cgroup's limit ends it).
OBEY = """\
import os, time
ballast_seen = len(ballast)  # (the notebook's value file: looked for after the round)
def obey():
    path, blocks = f"{told}/{os.getpid()}", []
    while os.path.exists(path):
        if open(path).read() == "grow":
            blocks.append(b"x" * (32 << 20))
        time.sleep(0.05)
"""


def program(name):
    """The cell of program `name`, obeying the harness after each step."""
    return OBEY + PROGRAMS[name].replace("{told}", "obey()")


LIGHTNING = """\
import os, time, torch, lightning as L
import hvd_magic

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, index):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_batch_end(self, outputs, batch, index):
        hvd_magic.report(step=self.global_step, total=steps)
        time.sleep(0.03)
        {told}

torch.manual_seed(0)
model = Tiny()
# (Lightning's devices are a host's ranks, its nodes the hosts, as torchrun's variables say)
world, hosts = int(os.environ["WORLD_SIZE"]), int(os.environ["GROUP_WORLD_SIZE"])
data = torch.utils.data.DataLoader(torch.randn(steps * 4 * world, 8), batch_size=4)
trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=world // hosts, num_nodes=hosts,
                    max_steps=steps,
                    enable_checkpointing=False, logger=False, enable_model_summary=False,
                    enable_progress_bar=False)
trainer.fit(model, data)
model.layer.weight.detach().flatten().tolist()
"""

# "session": the Horovod loop as a cell of a warm session started for the round
PROGRAMS = {"ddp": DDP, "elastic": ELASTIC, "horovod": HOROVOD, "lightning": LIGHTNING,
            "session": HOROVOD}
LAUNCHERS = {"driver": "--np -{np}", "spark": "--np {np}", "cluster": "--np {np}"}
FAULTS = ("kill", "freeze", "cancel", "interrupt", "task", "executor", "oom", "notebook",
          "worker", "cut", "none")
# Where a fault cannot happen: no Spark task on the driver; an executor of its own, a standalone
# worker only on the cluster (local Spark's executor is the notebook's JVM).
NOT_ON = {"driver": {"task", "executor", "worker", "cut"},
          "spark": {"executor", "worker", "cut"}, "cluster": set()}
NOTEBOOK_GONE = 30.0    # seconds for the ranks, tasks and templates of a killed notebook to go
JVM_GONE = 120.0        # and for its Spark JVM (it reads its end only once its start-up is over)


def draw(seed, number, launchers, programs, faults, timeout=TIMEOUT, neighbours=0.0):
    """Round `number` of seed `seed`: what runs, what goes wrong, and when (`timeout`: the
    --timeout of a round whose rank is frozen; `neighbours`: the share of rounds played beside
    a second notebook). Every fault with every program, freeze x elastic included (a frozen
    member must be given up and the run go on); but a session started by a killed notebook
    (the notebook's fault is the session's end)."""
    rng = random.Random(f"{seed}:{number}")
    program = rng.choice(programs)
    launcher = rng.choice(launchers)
    fault = rng.choice([f for f in faults if not (program == "session" and f == "notebook")
                        and f not in NOT_ON[launcher]])
    # Lightning on the cluster: as many ranks on each of its two hosts (two each)
    np = 4 if program == "lightning" and launcher == "cluster" else NP
    return {"seed": seed, "round": number, "launcher": launcher, "np": np,
            "program": program, "fault": fault, "victim": rng.randrange(np),
            "at_step": rng.choice([0, rng.randint(1, 25)]),  # 0: in its start (imports, init)
            "extra_delay": round(rng.uniform(0, 0.05), 3),
            "timeout": timeout, "cut_seconds": round(rng.uniform(3, 20), 1),
            # (its own generator: the draws above are the same with and without neighbours)
            "neighbour": fault != "notebook" and
            random.Random(f"{seed}:{number}:beside").random() < neighbours}


def launcher_option(round_):
    return LAUNCHERS[round_["launcher"]].format(np=round_.get("np", NP))


def options(round_):
    line = "--background --quiet"
    if round_["program"] != "session":  # (a session's cell runs where the session is)
        line = f"{launcher_option(round_)} {line}"
    if round_["program"] == "elastic":
        line += f" --min-np {NP - 1}"
    if round_["fault"] == "freeze" and round_["program"] == "elastic" and gives_up_frozen():
        line += f" --frozen-timeout {FROZEN_TIMEOUT}"  # (given up, the run goes on)
    elif round_["fault"] == "freeze":  # (an elastic run where no frozen member is given up
        line += f" --timeout {round_['timeout']}"  # ends by its timeout: a lost run, shown)
    return line


FROZEN_TIMEOUT = 10  # --frozen-timeout of an elastic round whose member is frozen (seconds)


def gives_up_frozen():
    """Whether this hvd_magic declares a frozen elastic member lost (``--frozen-timeout``: the
    elastic branch's, #84 item 3); where not, freeze x elastic is drawn and fails, shown."""
    import dataclasses
    from hvd_magic import config
    return any(f.name == "frozen_timeout" for f in dataclasses.fields(config.Placement))


def deadline(round_):
    """Seconds the round's run may take at most: its work, start-up, and what its fault adds."""
    base = {"driver": 90.0, "spark": 120.0, "cluster": 150.0}[round_["launcher"]]
    if round_["program"] == "elastic":
        base += 60.0  # a replacement's start and the world formed again
        if round_["fault"] == "worker":
            base += 60.0  # the worker started again, its executor registered
    if round_["fault"] == "freeze" and round_["program"] == "elastic" and gives_up_frozen():
        return base + FROZEN_TIMEOUT
    return base + {"freeze": round_["timeout"], "oom": chaos_faults.SEEN_WAIT,
                   "cut": round_.get("cut_seconds", 0) + 30}.get(round_["fault"], 0)


# the code a round runs: the product, its install, and the harness (not its outputs, the other
# benchmarks or prose)
RUN_CODE = ("hvd_magic", "pyproject.toml", "requirements", "scripts", "Makefile", "bench/chaos*.py",
            "tests/simhosts.py")


def _commit():
    """The last commit that changed the code a round runs (`RUN_CODE`; read once, as it starts:
    a commit made while a soak runs is not the code it runs), "-dirty" where the worktree had
    changes to it. A commit of soak outputs, prose or other benchmarks keeps the code's commit,
    so that a soak's sittings, with its outputs committed between them, are all of one commit."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = ["--", *RUN_CODE]
    try:
        commit = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h", "--abbrev=7"]
                                + paths, capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", root, "status", "--porcelain"] + paths,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return (commit + "-dirty" if changed else commit) or "?"


COMMIT = _commit()


def _timed(outcome, done, ended, recovery=None):
    """The round's time from its fault to its error (or an elastic run's world formed again),
    and "slow" where that is past the fault's bound."""
    at = done.get("at")
    if not done.get("struck") or at is None:
        return []
    seconds = recovery.seconds if recovery is not None and recovery.seconds is not None \
        else ended - at
    if outcome["fault"] == "cut" or (outcome["program"] == "elastic" and outcome["state"] == "done"
                                     and recovery is not None and recovery.seconds is None):
        outcome["to_error"] = None  # (a healed cut, a recovery unseen: nothing to time)
        return []
    outcome["to_error"], outcome["bound"] = round(seconds, 2), chaos_faults.bound(outcome)
    if outcome["bound"] is not None and seconds > outcome["bound"]:
        return [f"slow: {seconds:.1f} s from the {outcome['fault']} to the error, over its "
                f"bound of {outcome['bound']:.0f} s"]
    return []


def play(ip, round_):
    """Run one round; its outcome: the round with ``ok``, ``struck`` (and when: ``to_error``)
    and, where not ok, ``problems``."""
    import hvd_magic

    if round_["fault"] == "notebook":
        return play_notebook(round_)
    if round_["launcher"] == "cluster":
        CLUSTER.use()
    elif round_["launcher"] == "spark":
        CLUSTER.leave()
        hvd_magic.spark_session()
    marks = [time.monotonic()]  # (where the round's time went: the outcome's "phases")
    neighbour = Neighbour(round_["seed"], round_["round"]) if round_.get("neighbour") else None
    problems = []
    if neighbour is not None and not neighbour.wait_started():
        problems.append("neighbour touched: its ranks never started")
    told = tempfile.mkdtemp(prefix="chaos-told-")
    ip.user_ns.update(steps=STEPS, told=told, ballast=BALLAST)
    record = leaks.Record()
    unwatch = leaks.watch_values(record)
    began = time.monotonic()
    limit = began + deadline(round_)
    try:  # (watched until the run's end: a run prepares its values in a thread of its own)
        if round_["program"] == "session":
            ip.run_line_magic("horovod_session", f"start {launcher_option(round_)}")
        run = ip.run_cell_magic("distributed", options(round_), program(round_["program"]))
        done = chaos_faults.strike(run, round_, told, limit, record)
        recovery = chaos_faults.Recovery(run, done["at"]) if done.get("struck") and \
            round_["program"] == "elastic" and done.get("at") else None
        error = None
        try:
            run.wait(max(1.0, limit - time.monotonic()))
        except Exception as exc:  # noqa: BLE001  (the run's error: checked below)
            error = exc
        ended = time.monotonic()
    finally:
        unwatch()
    marks.append(ended)
    record.ranks(r.pid for r in run.ranks)
    chaos_faults.settle(done, record)
    if run.state == "running":
        problems.append(f"hang: still running after {deadline(round_):.0f} s")
        run.cancel()
        try:
            run.wait(60)
        except Exception:  # noqa: BLE001
            pass
    problems += _misnamed(round_, run, error, done.get("lost"), done.get("whole world"))
    if done.get("stopped") is not None:  # (a frozen rank the stop could not end: a leak below)
        try:
            os.kill(done["stopped"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    if round_["program"] == "session":
        problems += _session_after(ip, round_, run)
    marks.append(time.monotonic())
    problems += leaks.left_behind(lambda: leaks.leftovers(run, record), leaks.LEAK_WAIT)
    problems += leaks.files_left(run.id, record) + leaks.ports_left(record)
    problems += leaks.jobs_left(run) + leaks.cgroup_left(record.cgroup)
    logs = [k for k in range(round_.get("np", NP))
            if not os.path.exists(run.folder.log_path(k))]
    if logs:
        problems.append(f"lost logs: no log of rank(s) {logs}")
    marks.append(time.monotonic())
    if neighbour is not None:
        problems += neighbour.finish()
    shutil.rmtree(told, ignore_errors=True)
    marks.append(time.monotonic())
    CLUSTER.mend()
    marks.append(time.monotonic())
    outcome = dict(round_, run=run.id, commit=COMMIT, seconds=round(ended - began, 2),
                   phases=_phases(marks, began),
                   state=run.state, struck=done.get("struck"), unstruck=done.get("how"),
                   values=len(record.values), error=type(error).__name__ if error else None,
                   said=str(error).splitlines()[0][:300] if error else None)
    problems += _timed(outcome, done, ended, recovery)
    return dict(outcome, ok=not problems, problems=problems)


def _phases(marks, began):
    """Seconds of a round's phases: its launcher's session and its neighbour made ready
    ("ready"), its run ("run"), its checks of how it ended and its session's next cell
    ("after"), its leak checks ("leaks"), its neighbour's end ("neighbour"), the cluster
    mended ("mend")."""
    ready, ended, after, leaked, finished, mended = marks
    return {name: round(b - a, 2) for name, a, b in (
        ("ready", ready, began), ("run", began, ended), ("after", ended, after),
        ("leaks", after, leaked), ("neighbour", leaked, finished), ("mend", finished, mended))}


def _session_after(ip, round_, run):
    """A session after its cell's fault: usable (its next cell's result on every rank), or
    saying it needs a restart; then stopped. What is wrong ([] if nothing)."""
    import hvd_magic
    problems = []
    try:
        ip.run_cell_magic("distributed", "--quiet", "1")
        if hvd_magic.last_run().results != [1] * NP:
            problems.append(f"unusable session: its next cell gave {hvd_magic.last_run().results}")
    except hvd_magic.LaunchError as exc:
        if "%horovod_session restart" not in str(exc):
            problems.append(f"unusable session: {str(exc)[:300]}")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"unusable session: {type(exc).__name__}: {str(exc)[:300]}")
    ip.run_line_magic("horovod_session", "stop")
    return problems



NOTEBOOK = """\
import json, sys, time
from IPython.testing.globalipapp import start_ipython
import hvd_magic
from hvd_magic import payload
made, make = [], payload.LocalFile.__init__
def recording(self, data):  # (the harness's hook: each value file named as it is made)
    make(self, data)
    made.append(self.path)
payload.LocalFile.__init__ = recording
round_ = json.loads(sys.argv[1])
ip = start_ipython()
ip.run_line_magic("load_ext", "hvd_magic")
app = None
if round_["launcher"] == "spark":
    app = hvd_magic.spark_session().sparkContext.applicationId
elif round_["launcher"] == "cluster":  # an application of its own on the soak's cluster
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master(round_["master"]).appName("chaos-notebook")
    for key, value in round_["conf"].items():
        builder = builder.config(key, value)
    app = builder.getOrCreate().sparkContext.applicationId
ip.user_ns.update(steps=round_["steps"], told=round_["told"], ballast=b"\\0" * (5 << 20))
run = ip.run_cell_magic("distributed", round_["options"], round_["cell"])
print("CHAOS", json.dumps({"run": run.id, "folder": run.run_dir, "app": app}), flush=True)
while True:
    print("CHAOS", json.dumps({"state": run.state, "pids": [r.pid for r in run.ranks],
                      "steps": [r.step or 0 for r in run.ranks],
                      "values": made}), flush=True)
    time.sleep(0.02)
"""


def _executors_of(app):
    """The executor JVMs of Spark application `app` (its own id: no other notebook's) with
    every process under them."""
    import psutil
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        line = process.info["cmdline"] or []
        if "CoarseGrainedExecutorBackend" in " ".join(line) and app in line:
            found.add(process.pid)
            found |= {p.pid for p in process.children(recursive=True)}
    return found


def play_notebook(round_):
    """The notebook fault: the round's run started by a notebook of its own (an IPython shell in
    a process of its own; on the cluster, an application of its own there), SIGKILLed at the
    round's moment; every process it had (its Spark JVM and, on the cluster, its executors,
    templates, tasks, ranks) must be gone within NOTEBOOK_GONE (the JVMs: JVM_GONE), and its
    ranks' folders and value files with them, without a word from it."""
    import psutil

    told = tempfile.mkdtemp(prefix="chaos-told-")
    spec = dict(round_, steps=STEPS, told=told, options=options(round_),
                cell=program(round_["program"]))
    if round_["launcher"] == "cluster":  # (its cores are this soak's session's until it leaves)
        spec.update(CLUSTER.lend())
    record = leaks.Record()
    began = time.monotonic()
    limit = began + deadline(round_)
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK, json.dumps(spec)],
                                stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    problems, first, last = [], None, None
    victim, at = round_["victim"], round_["at_step"]
    try:
        for line in notebook.stdout:
            if not line.startswith("CHAOS "):
                continue  # (what the notebook says besides)
            said = json.loads(line[len("CHAOS "):])
            first = first or said
            record.values |= set(said.get("values", ()))
            last = said if "pids" in said else last
            if last and (last["state"] != "running" or time.monotonic() > limit or
                         last["pids"][victim] and last["steps"][victim] >= at):
                break
        time.sleep(round_["extra_delay"])
        struck = bool(last) and last["state"] == "running" and _alive(notebook.pid)
        family = {p.pid for p in psutil.Process(notebook.pid).children(recursive=True)}
        if first and first.get("app") and round_["launcher"] == "cluster":
            family |= _executors_of(first["app"])
        record.ranks((last or {}).get("pids", []))
        jvms = {pid for pid in family if "java" in _command(pid).split(" ")[0]}
    finally:
        notebook.kill()
        notebook.wait()
    killed = time.monotonic()
    if first is None:
        problems.append("lost run: the notebook ended before its run started")
        first = {"run": "?", "folder": None}
    ranks = {pid for pid in (last or {}).get("pids", []) if pid}
    ours = family | ranks | _named(first["run"])
    born = {p: leaks._started(p) for p in ours}  # (a pid given again since is not ours)

    def still(pids):
        return sorted(p for p in pids if _alive(p) and leaks._started(p) == born.get(p))
    problems += leaks.left_behind(lambda: still(ours - jvms), NOTEBOOK_GONE)
    ours_gone = round(time.monotonic() - killed, 1)
    problems += leaks.ports_left(record)  # (its ranks' ports: the ranks are gone)
    parts = leaks.new_parts(record)
    shutil.rmtree(told, ignore_errors=True)
    outcome = dict(round_, run=first["run"], commit=COMMIT, seconds=round(killed - began, 2),
                   state="killed", error=None, gone=ours_gone, jvm_gone=None,
                   jvms=len(jvms), struck=struck, values=len(record.values),
                   unstruck=None if struck else "its run had ended before the notebook's kill",
                   to_error=ours_gone if struck else None, bound=chaos_faults.bound(round_))
    if struck and ours_gone > outcome["bound"]:
        problems.append(f"slow: the killed notebook's processes went {ours_gone} s after it, "
                        f"over the bound of {outcome['bound']:.0f} s")

    def later():
        """Its JVMs gone (JVM_GONE at most), then its files and logs looked for: while the next
        round runs (by pid and start time, its run's id, the paths it recorded and the partial
        folders there were before: nothing of the next round's is taken for this one's)."""
        found = leaks.left_behind(lambda: still(jvms), JVM_GONE, what="jvm")
        whole["jvm_gone"] = round(time.monotonic() - killed, 1) if jvms else None
        found += leaks.files_left(first["run"], record, parts=parts)
        started = [k for k, step in enumerate((last or {}).get("steps", [])) if step >= 1]
        if first["folder"] is not None:
            logs = [k for k in started if not os.path.exists(
                os.path.join(first["folder"], f"rank-{k}.log"))]
            if logs:
                found.append(f"lost logs: no log of rank(s) {logs}")
        return found
    whole = dict(outcome, ok=not problems, problems=problems)
    whole["later"] = later  # (taken off by _played, which makes these checks in a thread)
    return whole


def _misnamed(round_, run, error, lost=None, whole=False):
    """What is wrong with how the run ended, for its fault ([] if nothing); `lost`: the ranks
    of a killed worker, `whole`: they were the elastic run's whole world (no survivor holds
    its state: the run must end saying so)."""
    fault, elastic = round_["fault"], round_["program"] == "elastic"
    message = str(error) if error is not None else ""
    if run.state == "running":
        return []  # (a hang, said already)
    ended_whole = "every rank it had was lost" in message
    if elastic and whole is None and ended_whole:
        return []  # (no world had formed: every rank that had started was on the worker)
    if elastic and whole and run.state != "done":
        if not ended_whole:
            return [f"misnamed: the elastic run lost its whole world {lost}, and said: "
                    f"{type(error).__name__} ({message[:300]})"]
        return []
    if fault == "cut" and round_["program"] in ("horovod", "session") and \
            "the Gloo rendezvous failed" in message:
        # a Horovod rank that met the cut in hvd.init(): Horovod's rendezvous client gives up
        # after three tries half a second apart; the error names the rendezvous it could not
        # reach (replayed: seed 9, round 124)
        return []
    # an elastic run goes on without a lost member: killed, out of memory, its task, executor
    # or worker lost, or frozen (given up in bounded time: ELASTIC's frozen member lost)
    if fault in ("none", "cut") or (fault in ("kill", "task", "executor", "oom", "worker",
                                              "freeze") and elastic):
        if run.state != "done":
            return [f"lost run: {run.state} ({type(error).__name__}: {message[:300]})"]
        if elastic and len({json.dumps(r) for r in run.results}) != 1:
            return ["unequal weights after the elastic run"]
        return []
    expected = {"kill": ("RankError",), "freeze": ("RunTimeout",), "cancel": ("RunCancelled",),
                "interrupt": ("RunCancelled",), "oom": ("RankError",),
                # (a session's lost task is its rank's end: the cell's RankError names it)
                "task": ("RankError",) if round_["program"] == "session" else ("LaunchError",),
                "executor": ("LaunchError", "RankError"),
                "worker": ("LaunchError", "RankError")}[fault]
    if type(error).__name__ not in expected:
        if run.state == "done" and fault in ("cancel", "interrupt", "kill", "task", "executor",
                                             "worker"):
            return []  # the fault came after the last step (the run had ended)
        return [f"misnamed: {type(error).__name__} ({message[:300]}), not {expected[0]}"]
    if fault in ("worker", "executor"):  # a rank of the lost executor named, and where it ran
        if not any(f"rank {k}" in message for k in lost or ()) or "executor" not in message:
            return [f"misnamed: the lost {fault}'s error names none of its ranks {lost} and "
                    f"their executor: {message[:300]}"]
        return []
    words = {"kill": ("SIGKILL",), "oom": ("out of memory",),
             "task": ("its task",) if round_["program"] == "session" else ("Spark task",)}
    if fault in words and not all(w in message for w in (f"rank {round_['victim']}",
                                                         *words[fault])):
        return [f"misnamed: the {fault}'s error does not name rank {round_['victim']} and "
                f"{' and '.join(words[fault])}: {message[:300]}"]
    return []




def slice_rounds(seed, count, launchers=("driver", "spark"), timeout=TIMEOUT,
                 programs=("ddp", "elastic", "horovod"), faults=("kill", "freeze", "cancel",
                                                                  "interrupt", "oom", "none")):
    """The suite's seeded slice: `count` rounds of `seed`, their moments drawn in turn from
    init (the rank's start: its imports, its framework's init), early and late, their
    launchers in turn from `launchers`; program and fault drawn from the seed (a frozen rank's
    run under a --timeout of `timeout`; twice that on Spark, whose start the timeout counts too:
    on a loaded machine a rank reached step 3 after 20 s, and the freeze never struck)."""
    chosen = []
    for number in range(count):
        rng = random.Random(f"slice:{seed}:{number}")
        launcher = launchers[number % len(launchers)]
        round_ = draw(seed, number, [launcher], list(programs), list(faults),
                      timeout if launcher == "driver" else 2 * timeout)
        moment = MOMENTS[number % len(MOMENTS)]
        round_.update(at_step={"init": 0, "early": rng.randint(1, 5),
                               "late": rng.randint(STEPS - 20, STEPS - 12)}[moment],
                      moment=moment)
        chosen.append(round_)
    return chosen


def refused(faults):
    """The faults this machine cannot play, with why: a cut without network namespaces is
    refused, not played as nothing; the oom fault without a writable memory cgroup."""
    why = {}
    if "cut" in faults:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "tests"))
        import simhosts
        if simhosts.unavailable() is not None:
            why["cut"] = simhosts.unavailable()
    if "oom" in faults and chaos_faults.memory_cgroup_parent() is None:
        why["oom"] = "no writable memory cgroup (v1's controller, or v2's memory controller)"
    return why


def rounds(ip, seed, count, launchers=tuple(LAUNCHERS), programs=tuple(PROGRAMS),
           faults=FAULTS, only=None, out=sys.stderr, timeout=TIMEOUT, minutes=None,
           output=None, neighbours=0.0):
    """Play `count` rounds of `seed` (or round `only`; none begun after `minutes`); their
    outcomes, each also printed to `out` as a line of JSON (and appended to `output`, a
    .jsonl.gz). `neighbours`: the share of rounds played beside a second notebook."""
    why = refused(faults)
    for fault, reason in why.items():
        print(f"refused: the {fault} fault ({reason})", file=out, flush=True)
    faults = [f for f in faults if f not in why]
    outcomes, began = [], time.monotonic()
    for number in ([only] if only is not None else range(count)):
        if minutes is not None and time.monotonic() - began > minutes * 60:
            break
        round_ = draw(seed, number, list(launchers), list(programs), list(faults), timeout,
                      neighbours)
        outcomes.append(_played(ip, round_, out, output))
    finished()
    return outcomes


_PENDING = []  # the threads finishing rounds' checks made later (a killed notebook's JVMs)
_WRITING = threading.Lock()


def _played(ip, round_, out, output):
    """Play a round; its outcome, said and written once its checks are all made: those it
    leaves for later (`later`) made by a thread while the next round runs."""
    outcome = play(ip, round_)
    later = outcome.pop("later", None)
    if later is None:
        _said(outcome, out, output)
        return outcome

    def finish():
        found = later()
        outcome.update(problems=outcome["problems"] + found, ok=outcome["ok"] and not found)
        _said(outcome, out, output)
    thread = threading.Thread(target=finish, name=f"chaos-later-{round_['round']}")
    thread.start()
    _PENDING.append(thread)
    return outcome


def finished():
    """Wait for the checks left for later (every outcome then whole)."""
    while _PENDING:
        _PENDING.pop().join()


def _said(outcome, out, output):
    with _WRITING:
        print(json.dumps(outcome), file=out, flush=True)
        if output:
            chaos_table.write(output, outcome)
        if not outcome["ok"]:
            soak = "--soak " if outcome.get("plan") == "soak" else ""
            print(f"FAILED round: {soak}--seed {outcome['seed']} --only {outcome['round']}: "
                  f"{outcome['problems']}", file=out, flush=True)


def replay(ip, recorded, out=sys.stderr, output=None):
    """Play again the rounds of `recorded` outcomes, as they were drawn; their new outcomes."""
    keys = ("seed", "round", "launcher", "np", "program", "fault", "victim", "at_step",
            "extra_delay", "timeout", "cut_seconds", "neighbour", "moment", "plan")
    outcomes = [_played(ip, {k: old[k] for k in keys if k in old}, out, output)
                for old in recorded]
    finished()
    return outcomes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--minutes", type=float, default=None,
                        help="begin no round after this many minutes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", type=int, default=None, help="replay this round of the seed")
    parser.add_argument("--launchers", nargs="+", default=list(LAUNCHERS))
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS))
    parser.add_argument("--faults", nargs="+", default=list(FAULTS))
    parser.add_argument("--neighbours", type=float, default=0.25,
                        help="the share of rounds played beside a second notebook")
    parser.add_argument("--out", metavar="JSONL_GZ",
                        help="append each round to this compressed output (bench/soak/...)")
    parser.add_argument("--json")
    parser.add_argument("--replay", metavar="FILE",
                        help="play again the rounds printed in FILE (those that failed, with "
                             "--failed), as they were drawn")
    parser.add_argument("--failed", action="store_true")
    parser.add_argument("--slice", action="store_true",
                        help="with --only R: play round R of the suite's seeded slice "
                             "(tests/test_chaos.py), as it draws it")
    parser.add_argument("--soak", type=int, metavar="COUNTED", nargs="?", const=1000,
                        help="the long soak: play every launcher x program x fault pair in "
                             "turn until COUNTED rounds (default 1000) counted, appending to "
                             "--out and skipping the rounds it holds (resumable; one commit)")
    parser.add_argument("--table", nargs="*", metavar="OUTPUT",
                        help="print the tables of earlier rounds' outputs (default: the "
                             "committed bench/soak/*.jsonl.gz; no round run)")
    parser.add_argument("--write", metavar="MARKDOWN",
                        help="with --table: put the tables between MARKDOWN's markers")
    args = parser.parse_args()
    if args.table is not None:
        paths = args.table or chaos_table.committed()
        outcomes = [o for path in paths for o in chaos_table.outcomes_in(path)]
        text = chaos_table.markdown(outcomes)
        if args.write:
            chaos_table.rewrite(args.write, text)
        print(text)
        return 0
    if args.soak is not None and args.only is None:  # (said before any round begins)
        why = chaos_soak.resumable(args.out, COMMIT, args.seed) if args.out else \
            "--soak needs --out bench/soak/NAME.jsonl.gz (the output it appends to, resumes)"
        if why:
            print(f"soak refused: {why}", file=sys.stderr)
            return 2
    from IPython.testing.globalipapp import start_ipython

    # a TERM ends the soak as an exception would: its cluster, hosts and cgroups are undone
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    began = time.monotonic()
    if args.slice and args.only is not None:
        outcomes = [_played(ip, slice_rounds(args.seed, args.only + 1)[args.only], sys.stderr,
                            args.out)]
        finished()
    elif args.soak is not None:
        if args.only is not None:
            played = chaos_soak.played_pairs(sys.modules[__name__], args.launchers,
                                             args.programs, args.faults)
            outcomes = [_played(ip, chaos_soak.soak_round(
                sys.modules[__name__], args.seed, args.only, played, TIMEOUT, args.neighbours),
                sys.stderr, None)]
            finished()
        else:
            outcomes = chaos_soak.soak(sys.modules[__name__], ip, args.seed, args.soak, args.out,
                                       args.launchers, args.programs, args.faults, TIMEOUT,
                                       args.neighbours, minutes=args.minutes)
    elif args.replay:
        outcomes = replay(ip, [o for o in chaos_table.outcomes_in(args.replay)
                               if not args.failed or not o["ok"]], output=args.out)
    else:
        outcomes = rounds(ip, args.seed, args.rounds, args.launchers, args.programs,
                          args.faults, args.only, minutes=args.minutes, output=args.out,
                          neighbours=args.neighbours)
    print(chaos_table.markdown(outcomes))
    failed = [o for o in outcomes if not o["ok"]]
    print(f"{len(outcomes)} rounds in {time.monotonic() - began:.0f} s; {len(failed)} failed"
          + "".join(f"\n  --seed {o['seed']} --only {o['round']}: {o['problems']}"
                    for o in failed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(outcomes, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
