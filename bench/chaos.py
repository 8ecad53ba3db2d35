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
  3-20 s, then joined again; interrupt: the run cancelled while a rank is in its framework's
  init; none.

What it must show:

- **ends**: the run ends (a run whose hosts were cut apart for seconds: done) within a deadline
  derived from its options (the timeout, the elastic run's recovery), or the round counts a hang;
- **names its cause**: killed → a `RankError` naming the rank and SIGKILL; out of memory → a
  `RankError` naming the rank and "out of memory"; its task killed → a `LaunchError` naming the
  rank and its Spark task; frozen → `RunTimeout`; cancelled → `RunCancelled`; none → done. An
  elastic run that loses a rank (killed, out of memory, its task, its worker): no error, the
  survivors and the replacement end with equal weights (or, where the ranks lost were every
  rank it had, an error saying so); a lost worker → an error naming one of its ranks and their
  executor;
- **a session stays usable or says so**: the session's next cell runs on every rank, or is
  refused with "%horovod_session restart"; then it is stopped;
- **leaves nothing behind**: no process of the run (its ranks, and any whose command line names
  it) is left 10 s after it ended; a killed notebook's ranks, tasks and templates are gone within
  30 s of it, its Spark JVM (and on the cluster its executors) within 120 s (a JVM reads its
  notebook's end only once its start-up is over: the seconds are in each round's record);
- **keeps every log**: the run folder has a log for every rank (a killed notebook's: every rank
  that had reported a step).

A failing round prints its seed: ``--seed S --only R`` replays it; ``--replay FILE`` plays again
the rounds a soak printed there (a line of JSON a round), as they were drawn, also after the
harness has changed what a seed draws.

    .venv/bin/python bench/chaos.py [--rounds 40] [--seed 1] [--launchers driver spark]
                                    [--programs ddp elastic horovod]
                                    [--faults kill freeze cancel task oom notebook none]
                                    [--json PATH]
    .venv/bin/python bench/chaos.py --table A.json B.json   # the figures of earlier rounds

The suite runs a short seeded slice (tests/test_chaos.py); the long soak stays here.
"""

import argparse
import atexit
import collections
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

NP = 3
STEPS = 60
TIMEOUT = 20          # --timeout of a round whose rank is frozen (seconds)
LEAK_WAIT = 10.0      # seconds after the end for the run's processes to be gone

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
OOM_LIMIT = 160 << 20   # the memory cgroup a rank is moved into for the oom fault
SEEN_WAIT = 15.0        # seconds for the rank's sampler to see it there (it samples each second)
NOTEBOOK_GONE = 30.0    # seconds for the ranks, tasks and templates of a killed notebook to go
JVM_GONE = 120.0        # and for its Spark JVM (it reads its end only once its start-up is over)


def draw(seed, number, launchers, programs, faults, timeout=TIMEOUT):
    """Round `number` of seed `seed`: what runs, what goes wrong, and when (`timeout`: the
    --timeout of a round whose rank is frozen)."""
    rng = random.Random(f"{seed}:{number}")
    program = rng.choice(programs)
    launcher = rng.choice(launchers)
    fault = rng.choice([f for f in faults if not (program == "elastic" and f == "freeze")
                        and not (program == "session" and f == "notebook")
                        and f not in NOT_ON[launcher]])
    # Lightning on the cluster: as many ranks on each of its two hosts (two each)
    np = 4 if program == "lightning" and launcher == "cluster" else NP
    return {"seed": seed, "round": number, "launcher": launcher, "np": np,
            "program": program, "fault": fault, "victim": rng.randrange(np),
            "at_step": rng.choice([0, rng.randint(1, 25)]),  # 0: in its start (imports, init)
            "extra_delay": round(rng.uniform(0, 0.05), 3),
            "timeout": timeout, "cut_seconds": round(rng.uniform(3, 20), 1)}


def launcher_option(round_):
    return LAUNCHERS[round_["launcher"]].format(np=round_.get("np", NP))


def options(round_):
    line = "--background --quiet"
    if round_["program"] != "session":  # (a session's cell runs where the session is)
        line = f"{launcher_option(round_)} {line}"
    if round_["program"] == "elastic":
        line += f" --min-np {NP - 1}"
    if round_["fault"] == "freeze":
        line += f" --timeout {round_['timeout']}"
    return line


def deadline(round_):
    """Seconds the round's run may take at most: its work, start-up, and what its fault adds."""
    base = {"driver": 90.0, "spark": 120.0, "cluster": 150.0}[round_["launcher"]]
    if round_["program"] == "elastic":
        base += 60.0  # a replacement's start and the world formed again
        if round_["fault"] == "worker":
            base += 60.0  # the worker started again, its executor registered
    return base + {"freeze": round_["timeout"], "oom": SEEN_WAIT,
                   "cut": round_.get("cut_seconds", 0) + 30}.get(round_["fault"], 0)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _named(run_id):
    """Pids of the processes whose command line names run `run_id` (a fresh rank's folder)."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if run_id.encode() in f.read():
                        found.add(int(name))
            except OSError:
                pass
    return found


def _leftovers(run):
    """Pids of the run's processes still alive: every rank process it had (a forked rank's
    command line is its template's), and any process whose command line names the run."""
    pids = {r.pid for r in run.ranks if r.pid} | {
        c["pid"] for c in (run.membership or []) if isinstance(c.get("pid"), int)}
    return sorted(pid for pid in pids | _named(run.id) if _alive(pid))


def _at_step(run, rank, step, limit):
    """Wait until `rank` reported `step` (or the run ended, or `limit` passed)."""
    while run.state == "running" and time.monotonic() < limit:
        if (run.ranks[rank].step or 0) >= step and run.ranks[rank].pid:
            return True
        time.sleep(0.01)
    return False


def _task_of(pid):
    """The pid of the Spark task that runs rank process `pid`: the process that reads the
    rank's standard output (its pipe's read end; a forked rank's parent is its host's
    template, not its task)."""
    pipe = os.readlink(f"/proc/{pid}/fd/1")
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == pid:
            continue
        try:
            for fd in os.listdir(f"/proc/{name}/fd"):
                if os.readlink(f"/proc/{name}/fd/{fd}") == pipe:
                    with open(f"/proc/{name}/fdinfo/{fd}") as f:
                        flags = next(int(line.split()[1], 8) for line in f
                                     if line.startswith("flags:"))
                    if flags & 3 == os.O_RDONLY:
                        return int(name)
        except OSError:
            continue
    raise ProcessLookupError(f"no process reads rank process {pid}'s output")


def _memory_cgroup_parent():
    """This process's memory cgroup (v1), where a child can be made; None where it cannot."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                folder = "/sys/fs/cgroup/memory" + path
                return folder if os.access(folder, os.W_OK) else None
    return None


def _out_of_memory(run, victim, pid, told, limit):
    """The oom fault: rank `victim` (process `pid`) held, moved into a memory cgroup of
    OOM_LIMIT, and, once its sampler saw that limit, made to grow; the cgroup's folder."""
    parent = _memory_cgroup_parent()
    if parent is None:
        raise RuntimeError("the oom fault needs a writable cgroup v1 memory controller (root)")
    note = os.path.join(told, str(pid))
    with open(note + ".part", "w") as f:
        f.write("hold")
    os.replace(note + ".part", note)
    folder = os.path.join(parent, f"hvd_magic_chaos_{os.getpid()}_{pid}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "memory.limit_in_bytes"), "w") as f:
        f.write(str(OOM_LIMIT))
    with open(os.path.join(folder, "cgroup.procs"), "w") as f:
        f.write(str(pid))
    seen_by = min(limit, time.monotonic() + SEEN_WAIT)
    while run.state == "running" and time.monotonic() < seen_by and \
            (run.ranks[victim].usage.latest or {}).get("limit") != OOM_LIMIT:
        time.sleep(0.05)
    with open(note + ".part", "w") as f:
        f.write("grow")
    os.replace(note + ".part", note)
    return folder


class Cluster:
    """The standalone cluster of the "cluster" launcher (tests/conftest.py's, two workers of two
    cores on loopback addresses: the suite's), started at its first round and kept; its session
    made again where another launcher's took its place."""

    def __init__(self):
        self.cluster = self.folder = None
        self.down = None  # the worker a round killed and did not start again

    def use(self):
        from pyspark import SparkContext
        if self.cluster is None:
            self._start()
        sc = SparkContext._active_spark_context
        if sc is None or sc.master != self.cluster.url:
            self.cluster.session()  # (stops the session there was)

    def _start(self):
        """Two simulated hosts (tests/simhosts.py: the root network namespace and one more on a
        bridge), a worker on each; loopback addresses where namespaces cannot be made."""
        import contextlib
        tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "tests")
        sys.path.insert(0, tests)
        import simhosts
        from conftest import StandaloneCluster
        self.folder = tempfile.mkdtemp(prefix="chaos-cluster-")
        self.hosts = contextlib.ExitStack()
        atexit.register(self.stop)
        if simhosts.unavailable() is None:
            root, other = self.hosts.enter_context(simhosts.simulated_hosts(2))
            self.link = f"hvr{os.getpid()}x1"  # the other host's cable (its veth's bridge end)
            self.cluster = StandaloneCluster(self.folder,
                                             worker_hosts=(root.address, other.address),
                                             master_host=root.address,
                                             worker_prefixes={1: other.prefix}).start()
        else:
            self.link = None
            self.cluster = StandaloneCluster(self.folder).start()

    def cut(self, seconds):
        """The second host cut off from the first (its link down) for `seconds`, then back."""
        import simhosts
        simhosts.ip("link", "set", self.link, "down")
        try:
            time.sleep(seconds)
        finally:
            simhosts.ip("link", "set", self.link, "up")

    def lend(self):
        """Its cores freed for another application (the soak's session stopped); what that
        application's session is to be built with: {"master": ..., "conf": {...}}."""
        if self.cluster is None:
            self._start()
        from conftest import TEST_JVM_OPTIONS
        self.leave()
        return {"master": self.cluster.url,
                "conf": {"spark.driver.host": self.cluster.master_host,
                         "spark.driver.bindAddress": self.cluster.master_host,
                         "spark.ui.enabled": "false",
                         "spark.executor.cores": str(self.cluster.cores),
                         "spark.executor.memory": "1g",
                         "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
                         "spark.pyspark.python": sys.executable}}

    def leave(self):
        """The cluster's session stopped (a local one comes next)."""
        from pyspark import SparkContext
        sc = SparkContext._active_spark_context
        if self.cluster is not None and sc is not None and sc.master == self.cluster.url:
            from pyspark.sql import SparkSession
            SparkSession.builder.getOrCreate().stop()

    def kill_worker_of(self, pid, run, back):
        """SIGKILL the worker (its executor, Python workers and ranks) that runs rank process
        `pid`; with `back`, started again a moment later (an elastic run grows back); the ranks
        that were on it."""
        from conftest import ancestry
        chain = ancestry(pid)
        index = next(i for i, w in enumerate(self.cluster.workers) if w.pid in chain)
        lost = [r.rank for r in run.ranks
                if r.pid and _under(r.pid, self.cluster.workers[index].pid)]
        rings = [c for c in run.membership or () if c["t"] == "ring"]
        world = rings[-1]["slots"] if rings else []
        self.cluster.kill_worker(index)
        if back:
            time.sleep(1.0)
            self.cluster.restart_worker(index)
        else:
            self.down = index
        return lost, (set(world) <= set(lost)) if world else None  # (None: no world yet)

    def kill_executor_of(self, pid, run):
        """SIGKILL the executor JVM that runs rank process `pid`; the ranks it had."""
        from conftest import ancestry
        executor = next(p for p in ancestry(pid)
                        if "CoarseGrainedExecutorBackend" in _command(p, whole=True))
        lost = [r.rank for r in run.ranks if r.pid and _under(r.pid, executor)]
        os.kill(executor, signal.SIGKILL)
        return lost

    def mend(self):
        """The worker a round killed started again, and every slot registered."""
        from hvd_magic.launch.spark import cluster_slots
        from pyspark import SparkContext
        if self.cluster is None:
            return
        if self.down is not None:
            self.cluster.restart_worker(self.down)
            self.down = None
        sc = SparkContext._active_spark_context
        if sc is not None and sc.master == self.cluster.url:
            ready_by = time.monotonic() + 180
            while cluster_slots(sc) < 4 and time.monotonic() < ready_by:
                time.sleep(0.2)

    def stop(self):
        if self.cluster is not None:
            self.cluster.stop()
            self.hosts.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            self.cluster = None


CLUSTER = Cluster()


def _under(pid, ancestor):
    from conftest import ancestry
    try:
        return ancestor in ancestry(pid)
    except Exception:  # noqa: BLE001  (it is gone)
        return False


def _strike(run, round_, told, limit):
    """The round's fault, at its moment; what it did, to check and undo: {"stopped": a frozen
    pid, "cgroup": a folder made, "lost": the ranks of a killed worker}."""
    victim, fault = round_["victim"], round_["fault"]
    if fault == "interrupt":  # the person's interrupt while a rank is in its framework's init
        while run.state == "running" and time.monotonic() < limit and not (
                run.ranks[victim].blocked_op == "init" or (run.ranks[victim].step or 0) >= 1):
            time.sleep(0.005)
        run.cancel()
        return {}
    if fault == "none" or not _at_step(run, victim, round_["at_step"], limit):
        return {}
    time.sleep(round_["extra_delay"])
    pid = run.ranks[victim].pid
    try:
        if fault == "kill":
            os.kill(pid, signal.SIGKILL)
        elif fault == "freeze":
            os.kill(pid, signal.SIGSTOP)
            return {"stopped": pid}
        elif fault == "cancel":
            run.cancel()
        elif fault == "task":
            os.kill(_task_of(pid), signal.SIGKILL)
        elif fault == "cut" and CLUSTER.link is not None:  # the hosts apart, then together
            cut = threading.Thread(target=CLUSTER.cut, args=(round_["cut_seconds"],))
            cut.start()
            return {"cut": cut}
        elif fault == "executor":  # its JVM (the worker starts another)
            return {"lost": CLUSTER.kill_executor_of(pid, run)}
        elif fault == "oom":
            return {"cgroup": _out_of_memory(run, victim, pid, told, limit)}
        elif fault == "worker":
            lost, whole = CLUSTER.kill_worker_of(pid, run, back=round_["program"] == "elastic")
            return {"lost": lost, "whole world": whole}
    except (ProcessLookupError, FileNotFoundError):
        pass  # (it ended meanwhile)
    return {}


def play(ip, round_):
    """Run one round; its outcome: the round with ``ok`` and, where not, ``problems``."""
    import hvd_magic

    if round_["fault"] == "notebook":
        return play_notebook(round_)
    if round_["launcher"] == "cluster":
        CLUSTER.use()
    elif round_["launcher"] == "spark":
        CLUSTER.leave()
        hvd_magic.spark_session()
    told = tempfile.mkdtemp(prefix="chaos-told-")
    ip.user_ns.update(steps=STEPS, told=told)
    began = time.monotonic()
    limit = began + deadline(round_)
    if round_["program"] == "session":
        ip.run_line_magic("horovod_session", f"start {launcher_option(round_)}")
    run = ip.run_cell_magic("distributed", options(round_), program(round_["program"]))
    done = _strike(run, round_, told, limit)
    error = None
    try:
        run.wait(max(1.0, limit - time.monotonic()))
    except Exception as exc:  # noqa: BLE001  (the run's error: checked below)
        error = exc
    took = time.monotonic() - began
    if done.get("cut") is not None:
        done["cut"].join()
    problems = []
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
    problems += _left_behind(lambda: _leftovers(run), LEAK_WAIT)
    logs = [k for k in range(round_.get("np", NP))
            if not os.path.exists(run.folder.log_path(k))]
    if logs:
        problems.append(f"lost logs: no log of rank(s) {logs}")
    shutil.rmtree(told, ignore_errors=True)
    if done.get("cgroup") is not None:
        _remove_cgroup(done["cgroup"])
    CLUSTER.mend()
    return dict(round_, run=run.id, seconds=round(took, 2), state=run.state,
                error=type(error).__name__ if error else None,
                said=str(error).splitlines()[0][:300] if error else None, ok=not problems,
                problems=problems)


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


def _left_behind(leftovers, wait):
    """["leak: ..."] if `leftovers()` still names live processes after `wait` seconds (they
    are killed then); else []."""
    gone_by = time.monotonic() + wait
    left = leftovers()
    while left and time.monotonic() < gone_by:
        time.sleep(0.2)
        left = leftovers()
    named = [f"{pid} ({_command(pid)})" for pid in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"leak: processes {', '.join(named)} outlived the run"] if left else []


def _command(pid, whole=False):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            return text if whole else text[:160]
    except OSError:
        return "?"


def _remove_cgroup(folder):
    gone_by = time.monotonic() + 10
    while time.monotonic() < gone_by:
        try:
            os.rmdir(folder)
            return
        except OSError:  # (not empty yet: its process is being reaped)
            time.sleep(0.1)


NOTEBOOK = """\
import json, sys, time
from IPython.testing.globalipapp import start_ipython
import hvd_magic
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
ip.user_ns.update(steps=round_["steps"], told=round_["told"])
run = ip.run_cell_magic("distributed", round_["options"], round_["cell"])
print("CHAOS", json.dumps({"run": run.id, "folder": run.run_dir, "app": app}), flush=True)
while True:
    print("CHAOS", json.dumps({"state": run.state, "pids": [r.pid for r in run.ranks],
                      "steps": [r.step or 0 for r in run.ranks]}), flush=True)
    time.sleep(0.02)
"""


def _executors_of(app):
    """The executor JVMs of Spark application `app` with every process under them."""
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
    templates, tasks, ranks) must be gone within NOTEBOOK_GONE (the JVMs: JVM_GONE), without a
    word from it."""
    import psutil

    told = tempfile.mkdtemp(prefix="chaos-told-")
    spec = dict(round_, steps=STEPS, told=told, options=options(round_),
                cell=program(round_["program"]))
    if round_["launcher"] == "cluster":  # (its cores are this soak's session's until it leaves)
        spec.update(CLUSTER.lend())
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
            last = said if "pids" in said else last
            if last and (last["state"] != "running" or time.monotonic() > limit or
                         last["pids"][victim] and last["steps"][victim] >= at):
                break
        time.sleep(round_["extra_delay"])
        family = {p.pid for p in psutil.Process(notebook.pid).children(recursive=True)}
        if first and first.get("app") and round_["launcher"] == "cluster":
            family |= _executors_of(first["app"])
        jvms = {pid for pid in family if "java" in _command(pid).split(" ")[0]}
    finally:
        notebook.kill()
        notebook.wait()
    killed = time.monotonic()
    took = killed - began
    if first is None:
        problems.append("lost run: the notebook ended before its run started")
        first = {"run": "?", "folder": None}
    ranks = {pid for pid in (last or {}).get("pids", []) if pid}
    ours = family | ranks | _named(first["run"])
    problems += _left_behind(lambda: sorted(p for p in ours - jvms if _alive(p)), NOTEBOOK_GONE)
    ours_gone = round(time.monotonic() - killed, 1)
    problems += _left_behind(lambda: sorted(p for p in jvms if _alive(p)), JVM_GONE)
    jvm_gone = round(time.monotonic() - killed, 1) if jvms else None
    started = [k for k, step in enumerate((last or {}).get("steps", [])) if step >= 1]
    if first["folder"] is not None:
        logs = [k for k in started if not os.path.exists(os.path.join(first["folder"],
                                                                      f"rank-{k}.log"))]
        if logs:
            problems.append(f"lost logs: no log of rank(s) {logs}")
    shutil.rmtree(told, ignore_errors=True)
    return dict(round_, run=first["run"], seconds=round(took, 2), state="killed",
                error=None, gone=ours_gone, jvm_gone=jvm_gone, jvms=len(jvms), ok=not problems,
                problems=problems)


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
    if fault in ("none", "cut") or (fault in ("kill", "task", "executor", "oom", "worker")
                                    and elastic):
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


def rounds(ip, seed, count, launchers=tuple(LAUNCHERS), programs=tuple(PROGRAMS),
           faults=FAULTS, only=None, out=sys.stderr, timeout=TIMEOUT, minutes=None):
    """Play `count` rounds of `seed` (or round `only`; none begun after `minutes`); their
    outcomes, each also printed to `out` as a line of JSON."""
    outcomes, began = [], time.monotonic()
    for number in ([only] if only is not None else range(count)):
        if minutes is not None and time.monotonic() - began > minutes * 60:
            break
        round_ = draw(seed, number, list(launchers), list(programs), list(faults), timeout)
        outcome = play(ip, round_)
        outcomes.append(outcome)
        print(json.dumps(outcome), file=out, flush=True)
        if not outcome["ok"]:
            print(f"FAILED round: --seed {seed} --only {number}: {outcome['problems']}",
                  file=out, flush=True)
    return outcomes


def replay(ip, recorded, out=sys.stderr):
    """Play again the rounds of `recorded` outcomes, as they were drawn; their new outcomes."""
    keys = ("seed", "round", "launcher", "np", "program", "fault", "victim", "at_step",
            "extra_delay", "timeout", "cut_seconds")
    outcomes = []
    for old in recorded:
        outcome = play(ip, {k: old[k] for k in keys if k in old})
        outcomes.append(outcome)
        print(json.dumps(outcome), file=out, flush=True)
    return outcomes


def table(outcomes):
    """Markdown: rounds per fault and launcher (with the programs they ran), and the rounds that
    failed each check."""
    cells = collections.defaultdict(lambda: collections.Counter())
    programs = collections.defaultdict(lambda: collections.Counter())
    for o in outcomes:
        c = cells[(o["fault"], o["launcher"])]
        c["rounds"] += 1
        programs[(o["fault"], o["launcher"])][o["program"]] += 1
        for problem in o["problems"]:
            c[problem.split(":")[0]] += 1
    kinds = ["hang", "misnamed", "lost run", "unequal weights after the elastic run",
             "unusable session", "leak", "lost logs"]
    lines = ["| fault | launcher | rounds | programs | " + " | ".join(kinds) + " |",
             "|---|---|---:|---|" + "---:|" * len(kinds)]
    for (fault, launcher), c in sorted(cells.items()):
        ran = ", ".join(f"{p} {n}" for p, n in sorted(programs[(fault, launcher)].items()))
        lines.append(f"| {fault} | {launcher} | {c['rounds']} | {ran} | "
                     + " | ".join(str(c[k]) for k in kinds) + " |")
    return "\n".join(lines)


def _outcomes_in(path):
    """The outcomes in a --json file, or in what a run printed (a line of JSON a round)."""
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"seed"')]


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
    parser.add_argument("--json")
    parser.add_argument("--replay", metavar="FILE",
                        help="play again the rounds printed in FILE (those that failed, with "
                             "--failed), as they were drawn")
    parser.add_argument("--failed", action="store_true")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="print the table of earlier rounds' --json files (no round run)")
    args = parser.parse_args()
    if args.table:
        outcomes = [o for path in args.table for o in _outcomes_in(path)]
        print(table(outcomes))
        print(f"{len(outcomes)} rounds, seeds {sorted({o['seed'] for o in outcomes})}, "
              f"{sum(o['seconds'] for o in outcomes) / 60:.0f} minutes of runs; "
              f"{sum(not o['ok'] for o in outcomes)} failed")
        return 0
    from IPython.testing.globalipapp import start_ipython

    # a TERM ends the soak as an exception would: its cluster, hosts and cgroups are undone
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    began = time.monotonic()
    if args.replay:
        outcomes = replay(ip, [o for o in _outcomes_in(args.replay)
                               if not args.failed or not o["ok"]])
    else:
        outcomes = rounds(ip, args.seed, args.rounds, args.launchers, args.programs,
                          args.faults, args.only, minutes=args.minutes)
    print(table(outcomes))
    failed = [o for o in outcomes if not o["ok"]]
    drawn = "replayed" if args.replay else f"seed {args.seed}"
    print(f"{len(outcomes)} rounds ({drawn}) in {time.monotonic() - began:.0f} s; "
          f"{len(failed)} failed" + "".join(f"\n  --seed {o['seed']} --only {o['round']}: "
                                            f"{o['problems']}" for o in failed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(outcomes, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
