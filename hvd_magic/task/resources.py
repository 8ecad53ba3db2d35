"""What a rank uses, sampled by its task: CPU, memory, GPUs; and a death named out of memory.

`Sampler` is a thread of the task (never of the rank): about once a second it reads the rank's
process tree (the rank and its children: DataLoader workers...) with psutil and sends a
``resources`` event on the run's channel, as progress goes:

    {"t": "resources", "time": <unix seconds>, "cpu": <% of one core, summed>, "rss": <bytes>,
     "cores": <the cores the rank may use>, "peak": <the largest rss so far>, "limit": <bytes>,
     "limit_of": "cgroup" | "host", "free": <the host's available bytes>,
     "gpus": [{"index", "util", "mem", "mem_total"}]}

Only a live process is sampled: a rank that ended (a zombie until its task reaps it) has no
memory left to count, and its sample would read 0. A process's CPU is measured between two
samples, never from its first look (psutil's first reading is a baseline: a second one
microseconds later read 285% for a one-thread rank).

The limit is the rank's memory cgroup's (v1 ``memory.limit_in_bytes``, v2 ``memory.max``) where
it has one below the host's memory, else the host's. GPUs are read through NVML
(`task.nvml`: no framework is imported), those the rank was given, found there by UUID.

`Sampler.oom` says, once the rank died by SIGKILL, whether the kernel's OOM killer did it: the
count of OOM kills of the rank's cgroup (v1 ``memory.oom_control``, v2 ``memory.events``) or of the
host (``/proc/vmstat``) grew while it ran, and the kernel's log (``/dev/kmsg``), where it can be
read, names the rank's process: a count rises for any process there, another cgroup's on the host.

Not for: showing any of it (`hvd_magic.view`), or keeping it (`hvd_magic.driver`).
"""

import os
import threading
import time

from .nvml import Nvml

# psutil is imported where it is used: a task imports this module before the packages shipped
# with the job (psutil among them, where the executor lacks it: task/shipped.py) are on its path.

INTERVAL = 1.0
RESCAN = 5      # samples between two looks for the rank's child processes
_CGROUP = "/sys/fs/cgroup"


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _memory_cgroup(pid):
    """The folder of the memory cgroup process `pid` is in (v1's, else v2's), or None."""
    text = _read(f"/proc/{pid}/cgroup") or ""
    unified = None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return os.path.join(_CGROUP, "memory", path.lstrip("/"))
        if controllers == "":
            unified = os.path.join(_CGROUP, path.lstrip("/"))
    return unified if unified is not None and os.path.exists(unified) else None


def descendants(proc):
    """psutil's processes of `proc`'s descendants, from the kernel's list of each of its threads'
    children (``/proc/PID/task/TID/children``: a read per thread of the rank's tree); where the
    kernel keeps no such list, psutil's, which reads every process of the host (4-60 ms with a
    few hundred: a sampler shares the host's cores with the ranks)."""
    import psutil

    found, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # (it ended)
            continue
        for tid in tids:
            text = _read(f"/proc/{pid}/task/{tid}/children")
            if text is None and pid == proc.pid and os.path.exists(f"/proc/{pid}/task/{tid}"):
                return proc.children(recursive=True)  # (no such list in this kernel)
            for child in (text or "").split():
                try:
                    found.append(psutil.Process(int(child)))
                except psutil.NoSuchProcess:
                    continue
                todo.append(int(child))
    return found


def usable_cores(pid):
    """How many cores process `pid` may use: its CPU affinity, less its cgroup's CPU quota (v2
    ``cpu.max``, v1 ``cpu.cfs_quota_us``) where that is smaller."""
    try:
        cores = len(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    for line in (_read(f"/proc/{pid}/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            quota = (_read(os.path.join(_CGROUP, path.lstrip("/"), "cpu.max")) or "").split()
        elif "cpu" in controllers.split(","):
            folder = os.path.join(_CGROUP, "cpu,cpuacct", path.lstrip("/"))
            quota = [(_read(os.path.join(folder, name)) or "").strip()
                     for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us")]
        else:
            continue
        if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[1]):
            cores = min(cores, max(1, -(-int(quota[0]) // int(quota[1]))))
    return cores


def memory_limit(folder):
    """(bytes, "cgroup" | "host"): the cgroup's limit where it is below the host's memory."""
    import psutil

    host = psutil.virtual_memory().total
    if folder is not None:
        for name in ("memory.limit_in_bytes", "memory.max"):
            text = (_read(os.path.join(folder, name)) or "").strip()
            if text.isdigit() and int(text) < host:
                return int(text), "cgroup"
    return host, "host"


def _count(text, key="oom_kill"):
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def oom_kills(folder):
    """OOM kills in the cgroup `folder` so far (None where the kernel does not say)."""
    if folder is None:
        return None
    for name in ("memory.oom_control", "memory.events"):
        count = _count(_read(os.path.join(folder, name)))
        if count is not None:
            return count
    return None


def host_oom_kills():
    return _count(_read("/proc/vmstat"))


def named_by_kernel(pid):
    """Whether the kernel's log names process `pid` as killed by an OOM killer (True, False),
    or None where that log cannot be read here (``/dev/kmsg``: root, outside most containers)
    or its pids are another namespace's."""
    nspid = [line for line in (_read("/proc/self/status") or "").splitlines()
             if line.startswith("NSpid:")]
    if not nspid or len(nspid[0].split()) != 2:  # (a pid namespace of our own: other numbers)
        return None
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    needle = f"Killed process {pid} (".encode()
    try:
        while True:
            try:
                if needle in os.read(fd, 8192):
                    return True
            except BlockingIOError:  # (every record read)
                return False
            except BrokenPipeError:  # (a record overwritten while read: the next one)
                continue
    finally:
        os.close(fd)


class Sampler(threading.Thread):
    """Samples process `pid` and its children every `interval` seconds; `send(event)` each."""

    def __init__(self, pid, send, gpus=(), interval=INTERVAL):
        super().__init__(name="hvd-magic-resources", daemon=True)
        self.pid = pid
        self.send = send
        self.gpus = [str(g).strip() for g in gpus or ()]  # as the rank names them (nvml.py)
        self.interval = interval
        self.peak = 0
        self.limit = (None, None)
        # every memory cgroup the rank was seen in -> its OOM kills then; none is forgotten, for a
        # dying process is shown in its hierarchy's root before it is a zombie (cgroup v1)
        self._cgroups = {}
        self._seen_in(_memory_cgroup(pid))
        self._host_oom_before = host_oom_kills()
        self._processes = {}   # pid -> psutil.Process: cpu_percent compares with its last call
        self._tree = []        # the rank's descendants, as last looked for
        self._samples = 0
        self._stop = threading.Event()

    def run(self):
        import psutil

        nvml = Nvml() if self.gpus else None
        try:
            self._process(self.pid)  # (its CPU's baseline: the first sample is a second's)
        except psutil.NoSuchProcess:
            return
        while not self._stop.wait(self.interval):
            try:
                event = self.sample(nvml)
            except psutil.NoSuchProcess:
                return  # the rank ended
            except Exception:  # noqa: BLE001  (no figure is worth the task's life)
                continue
            if event is not None:
                self.send(event)

    def sample(self, nvml=None):
        """The rank's `resources` event now; None once it ended (a zombie: nothing to count,
        and a killed one, not yet reaped, is shown out of its cgroup: its limit stays the last
        one it lived under)."""
        import psutil

        known = set(self._processes)  # (a process first seen now has only its baseline)
        root = self._process(self.pid)
        if root.status() == psutil.STATUS_ZOMBIE:
            return None
        # The rank's child processes, looked for every RESCAN samples (`descendants`); in
        # between, the ones known.
        if self._samples % RESCAN == 0:
            self._tree = descendants(root)
        self._samples += 1
        tree = [root] + self._tree
        cpu = rss = 0
        for proc in tree:
            try:
                proc = self._process(proc.pid)
                cpu += proc.cpu_percent(None) if proc.pid in known else 0.0
                rss += proc.memory_info().rss
            except psutil.NoSuchProcess:  # (a child that ended: gone from the next look)
                if proc.pid == self.pid:
                    raise
        self._processes = {p.pid: self._processes[p.pid] for p in tree if p.pid in self._processes}
        if rss == 0:  # (it ended between the two looks)
            return None
        self.peak = max(self.peak, rss)
        folder = _memory_cgroup(self.pid)  # (a process may be moved to another cgroup)
        self._seen_in(folder)
        self.limit = memory_limit(folder)
        cores = usable_cores(self.pid)
        gpus = [g for g in (nvml.read(i) for i in self.gpus) if g] if nvml and nvml.lib else []
        # (never above what it may use: psutil's reading over a late sample's short interval)
        return {"t": "resources", "time": round(time.time(), 2),
                "cpu": round(min(cpu, 100.0 * cores), 1), "cores": cores, "rss": rss, "peak": self.peak, "limit": self.limit[0], "limit_of": self.limit[1],
                "free": psutil.virtual_memory().available, "gpus": gpus}

    def _process(self, pid):
        import psutil

        if pid not in self._processes:
            self._processes[pid] = psutil.Process(pid)
            self._processes[pid].cpu_percent(None)  # (its first call says 0.0: a baseline)
        return self._processes[pid]

    def stop(self):
        self._stop.set()

    def oom(self):
        """What the rank's SIGKILL was, if the kernel's OOM killer sent it: {"peak", "limit",
        "limit_of", "by"}; None if no OOM kill was counted while it ran."""
        risen = [folder for folder, before in self._cgroups.items()
                 if before is not None and (oom_kills(folder) or 0) > before]
        # (an ancestor may count its descendants' kills too: the tightest limit bit)
        limit, limit_of = min(memory_limit(folder) for folder in risen) if risen else (0, "host")
        if limit_of == "cgroup":
            by = "its cgroup's OOM killer"
        elif self._host_oom_before is not None and (host_oom_kills() or 0) > self._host_oom_before:
            limit, limit_of = self.limit if self.limit[0] else memory_limit(None)
            by = "the kernel's OOM killer"
        else:
            return None
        # a count is of every process there (the host's: another cgroup's kill counts too); where
        # the kernel's log can be read, it says whose
        if named_by_kernel(self.pid) is False:
            return None
        return {"peak": self.peak, "limit": limit, "limit_of": limit_of, "by": by}

    def _seen_in(self, folder):
        if folder is not None and folder not in self._cgroups:
            self._cgroups[folder] = oom_kills(folder)
