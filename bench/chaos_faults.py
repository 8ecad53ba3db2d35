"""The faults of bench/chaos.py, each struck at its round's moment and written down as struck
only where it happened: the signal delivered to a live process of the running run at its
moment, the run cancelled while it ran, the hosts' link read back down, the memory cgroup's
limit crossed. A fault that never struck (its rank had ended, the run was over) is said so:
the round is reported apart and counted as nothing. Each struck fault's time to the error (to
the run's end, or to an elastic run's world formed again) is held to a bound of its own."""

import os
import signal
import threading
import time

from chaos_cluster import CLUSTER
from chaos_leaks import _alive

OOM_LIMIT = 160 << 20   # the memory cgroup a rank is moved into for the oom fault
SEEN_WAIT = 15.0        # seconds for the rank's sampler to see it there (it samples each second)
# Seconds from the fault to the error (the run's end) at most; an elastic run that loses a rank
# to its world formed again (RECOVERY); a frozen rank's run to its --timeout's end (the timeout
# counts from the run's start, the bound from the stop: at most the timeout and FREEZE_SLACK).
BOUNDS = {"kill": 10.0, "task": 15.0, "executor": 20.0, "worker": 25.0, "oom": 15.0,
          "cancel": 10.0, "interrupt": 15.0, "notebook": 30.0}
RECOVERY = 45.0
FREEZE_SLACK = 15.0


def bound(round_):
    """The seconds from `round_`'s fault to its error at most (None: no error is due)."""
    fault = round_["fault"]
    if fault == "freeze":
        return round_["timeout"] + FREEZE_SLACK
    if round_["program"] == "elastic" and fault in ("kill", "task", "executor", "worker", "oom",
                                                     "freeze"):
        return RECOVERY
    return BOUNDS.get(fault)


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


def memory_cgroup_parent():
    """(folder, version): this process's memory cgroup where a child can be made (v1's memory
    controller, or v2's unified hierarchy with the memory controller given to children);
    None where neither can."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            folder = "/sys/fs/cgroup/memory" + path
            if os.access(folder, os.W_OK):
                return folder, 1
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" and controllers == "":
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                folder = root + path
                try:
                    with open(os.path.join(folder, "cgroup.subtree_control")) as f:
                        given = "memory" in f.read().split()
                except OSError:
                    continue
                if given and os.access(folder, os.W_OK):
                    return folder, 2
    return None


def _limit_crossed(folder, version):
    """Whether the cgroup's memory limit was met: v1's failcnt, v2's "max"/"oom_kill" events."""
    try:
        if version == 1:
            with open(os.path.join(folder, "memory.failcnt")) as f:
                return int(f.read()) > 0
        with open(os.path.join(folder, "memory.events")) as f:
            events = dict(line.split() for line in f)
        return int(events.get("max", 0)) + int(events.get("oom_kill", 0)) > 0
    except (OSError, ValueError):
        return False


def _tell(told, pid, word):
    note = os.path.join(told, str(pid))
    with open(note + ".part", "w") as f:
        f.write(word)
    os.replace(note + ".part", note)


def _out_of_memory(run, victim, pid, told, limit, record):
    """The oom fault: rank `victim` (process `pid`) held, moved into a memory cgroup of
    OOM_LIMIT, and, once its sampler saw that limit, made to grow; the cgroup is written into
    `record`; the moment the growth began."""
    parent = memory_cgroup_parent()
    if parent is None:
        raise RuntimeError("the oom fault needs a writable memory cgroup (v1's controller, or "
                           "v2's with memory in cgroup.subtree_control)")
    folder, version = parent
    _tell(told, pid, "hold")
    record.cgroup = os.path.join(folder, f"hvd_magic_chaos_{os.getpid()}_{pid}")
    os.makedirs(record.cgroup, exist_ok=True)
    limit_file = "memory.limit_in_bytes" if version == 1 else "memory.max"
    with open(os.path.join(record.cgroup, limit_file), "w") as f:
        f.write(str(OOM_LIMIT))
    with open(os.path.join(record.cgroup, "cgroup.procs"), "w") as f:
        f.write(str(pid))
    seen_by = min(limit, time.monotonic() + SEEN_WAIT)
    while run.state == "running" and time.monotonic() < seen_by and \
            (run.ranks[victim].usage.latest or {}).get("limit") != OOM_LIMIT:
        time.sleep(0.05)
    _tell(told, pid, "grow")
    return time.monotonic(), version


def strike(run, round_, told, limit, record):
    """The round's fault, at its moment. What it did, to check and undo: "struck" (whether it
    happened), "at" (when: monotonic), "how" (in words, where it did not strike), "stopped" (a
    frozen pid), "lost" (the ranks of a killed worker), "cut" (the cut's thread and what the
    host said), "cgroup" (its folder and version)."""
    victim, fault = round_["victim"], round_["fault"]
    if fault == "cut" and CLUSTER.link is None:
        raise RuntimeError("the cut fault needs network namespaces (tests/simhosts.py): refused")
    if fault == "none":
        return {"struck": False, "how": "no fault"}
    if fault == "interrupt":  # the person's interrupt while a rank is in its start
        # (its imports, its framework's init: its process runs, no step reported yet; the rank
        # says "init" as its blocked op only once that wait is long, so that is not waited for)
        while run.state == "running" and time.monotonic() < limit and \
                not run.ranks[victim].pid:
            time.sleep(0.005)
        time.sleep(round_["extra_delay"] * 20)  # (0-1 s into its start)
        starting = not run.ranks[victim].step
        running = run.state == "running"
        run.cancel()
        at = time.monotonic()
        how = None if running and starting else f"the run was {run.state} already" \
            if not running else f"rank {victim} had begun its steps (a cancel, then)"
        return {"struck": running and starting, "at": at, "how": how}
    if not _at_step(run, victim, round_["at_step"], limit):
        return {"struck": False, "how": f"rank {victim} never reached step {round_['at_step']} "
                                        f"(the run {run.state})"}
    time.sleep(round_["extra_delay"])
    pid = run.ranks[victim].pid
    record.ranks(r.pid for r in run.ranks)
    if run.state != "running" or not _alive(pid):
        return {"struck": False, "how": f"rank {victim} had ended (the run {run.state})"}
    try:
        if fault == "kill":
            os.kill(pid, signal.SIGKILL)
        elif fault == "freeze":
            os.kill(pid, signal.SIGSTOP)
            return {"struck": True, "at": time.monotonic(), "stopped": pid}
        elif fault == "cancel":
            run.cancel()
        elif fault == "task":
            os.kill(_task_of(pid), signal.SIGKILL)
        elif fault == "cut":  # the hosts apart, then together
            seen = {}
            cut = threading.Thread(target=CLUSTER.cut, args=(round_["cut_seconds"], seen))
            cut.start()
            return {"struck": None, "cut": cut, "seen": seen}  # (struck: once the host said)
        elif fault == "executor":  # its JVM (the worker starts another)
            return {"struck": True, "lost": CLUSTER.kill_executor_of(pid, run),
                    "at": time.monotonic()}
        elif fault == "oom":
            at, version = _out_of_memory(run, victim, pid, told, limit, record)
            return {"struck": None, "at": at, "cgroup version": version}  # (struck: crossed)
        elif fault == "worker":
            lost, whole = CLUSTER.kill_worker_of(pid, run, back=round_["program"] == "elastic")
            return {"struck": True, "lost": lost, "whole world": whole, "at": time.monotonic()}
    except (ProcessLookupError, FileNotFoundError) as exc:
        return {"struck": False, "how": f"its process had ended ({exc})"}
    return {"struck": True, "at": time.monotonic()}


def settle(done, record):
    """Once the run ended: whether a cut or an oom fault struck (the host read its link down;
    the cgroup's limit was crossed), and when."""
    if done.get("cut") is not None:
        done["cut"].join()
        done["struck"] = "at" in done["seen"]
        done["at"] = done["seen"].get("at")
        done["how"] = None if done["struck"] else "the link was never read back down"
    if "cgroup version" in done:
        done["struck"] = record.cgroup is not None and _limit_crossed(
            record.cgroup, done["cgroup version"])
        done["how"] = None if done["struck"] else "the cgroup's limit was never crossed"
    return done


class Recovery:
    """An elastic run's world formed again after its fault: the time of the first ring formed
    after a member was lost (a thread watches the run's membership until the run ends; a ring
    formed before any loss, as the run began, is not its recovery)."""

    def __init__(self, run, at):
        self.run, self.at, self.seconds = run, at, None
        self.seen = len(run.membership or ())
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while self.run.state == "running":
            changes = list(self.run.membership or ())[self.seen:]
            lost = next((k for k, c in enumerate(changes) if c.get("t") == "lost"), None)
            if lost is not None and any(c.get("t") == "ring" for c in changes[lost:]):
                self.seconds = round(time.monotonic() - self.at, 2)
                return
            time.sleep(0.05)
