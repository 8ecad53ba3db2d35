"""What one task does: the same code runs inside a Spark barrier task and in a driver-only thread.

1. Hosts are the executors' addresses as the cluster knows them (`Coordinator.task_address`);
   every task derives the same Horovod plan from them, and its own slot (rank, local rank...).
2. Task 0 starts Horovod's rendezvous server with that plan; the driver relays its port to the
   other tasks over the event channel (no Spark barrier sync, which costs about a second each).
3. Each task connects to the driver's event server (see `_DriverLink`).
4. It spawns the rank as a subprocess (``python -m hvd_magic.rank``) in its own process group, with
   Horovod's Gloo environment set explicitly, and forwards the rank's stdout, stderr and structured
   events to the driver's event server, labelled by rank.
5. It returns ``(rank, status, payload)``: the rank's pickled value, or its error summary.

A ``stop`` message from the driver (cancel, timeout, another rank failed) ends the rank's process
group: SIGTERM, a short grace, then SIGKILL.

Not for: IPython, widgets or anything the notebook shows. Settings travel as one small picklable
`TaskSettings`; the cell's function and values travel as bytes that only the rank unpickles.
"""

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .events import EventClient

# How long output may sit in the task before it is sent, and how much at most per frame.
FLUSH_INTERVAL = 0.05
MAX_BATCH_BYTES = 256 * 1024
STOP_GRACE_SECONDS = 3.0


@dataclasses.dataclass
class TaskSettings:
    run_id: str
    np: int
    events_address: str
    token: str
    job: bytes                      # pickled {"fn", "args", "kwargs", "sources"} (small values)
    horovod_env: dict               # HOROVOD_* knobs chosen by the driver
    broadcast_kwargs: dict = dataclasses.field(default_factory=dict)  # name -> Broadcast / bytes
    cwd: str = ""
    allow_retry: bool = False
    extra_env: dict = dataclasses.field(default_factory=dict)
    timeline: bool = False          # record a Horovod timeline on rank 0 for the whole run


class Coordinator:
    """What a task needs from its siblings; Spark's BarrierTaskContext or threads on the driver."""

    partition_id: int
    attempt: int

    def task_address(self, partition_id: int) -> str:
        """The host the cluster knows this task's executor by (reachable from the others)."""
        raise NotImplementedError

    def gpus(self) -> list:
        return []

    def executor(self) -> str:
        return "driver"


class SparkCoordinator(Coordinator):
    def __init__(self):
        from pyspark import BarrierTaskContext
        self.ctx = BarrierTaskContext.get()
        self.partition_id = self.ctx.partitionId()
        self.attempt = self.ctx.attemptNumber()

    def task_address(self, partition_id):
        return self.ctx.getTaskInfos()[partition_id].address.rsplit(":", 1)[0]

    def executor(self):
        return self.ctx.getTaskInfos()[self.partition_id].address

    def gpus(self):
        resource = self.ctx.resources().get("gpu")
        return list(resource.addresses) if resource is not None else []


def spark_task(settings, _iterator):
    """The function of the barrier stage (module level, so it pickles by reference)."""
    yield run_task(settings, SparkCoordinator())


# --- the plan ---------------------------------------------------------------------------------

def host_plan(hosts, np):
    """Horovod slots for tasks whose hosts are `hosts` (one entry per partition, in order).

    Returns one slot per partition. Tasks on the same host get consecutive local ranks in
    partition order; hosts are ordered by their first partition.
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    order = list(dict.fromkeys(hosts))
    counts = {h: hosts.count(h) for h in order}
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{counts[h]}" for h in order)), np)
    by_host = {h: [s for s in plan if s.hostname == h] for h in order}
    taken = {h: 0 for h in order}
    slots = []
    for h in hosts:
        slots.append(by_host[h][taken[h]])
        taken[h] += 1
    return plan, slots


def _resolve(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _local_ip_towards(ip):
    """The address of this machine that packets to `ip` leave from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _iface_of(ip):
    import psutil
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return "lo"


def visible_devices(assigned, visible=None):
    """CUDA_VISIBLE_DEVICES for a rank given the GPU addresses Spark assigned its task.

    When the executor itself sees only some GPUs (its own CUDA_VISIBLE_DEVICES) and Spark's
    addresses are indices into that list, they are mapped through it; otherwise they are used as
    they are (discovery scripts usually report the ids CUDA itself uses).
    """
    assigned = [str(a).strip() for a in assigned]
    if not visible or not assigned:
        return assigned
    seen = [v.strip() for v in visible.split(",") if v.strip()]
    if all(a.isdigit() and int(a) < len(seen) for a in assigned) and \
            not all(a in seen for a in assigned):
        return [seen[int(a)] for a in assigned]
    return assigned


def horovod_rank_env(slot, np, rendezvous_ip, rendezvous_port, iface):
    return {
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(np),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_ip,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_GLOO_IFACE": iface,
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }


# --- forwarding output ------------------------------------------------------------------------

class _Forwarder:
    """Sends a rank's lines and events to the driver in batches, in order, never splitting lines."""

    def __init__(self, client, rank):
        self.client = client
        self.rank = rank
        self.lock = threading.Lock()
        self.failed = False

    def send(self, event):
        event["rank"] = self.rank
        if self.failed:
            return
        try:
            self.client.send(event)
        except OSError:
            self.failed = True  # the driver went away; the rank's own work goes on

    def pump_lines(self, pipe, stream):
        """Read a pipe to its end; send complete lines in batches (a final partial line at EOF)."""
        fd = pipe.fileno()
        buffer = b""
        batch, batch_bytes, batch_started = [], 0, None
        import select
        while True:
            timeout = None if not batch else max(0.0, FLUSH_INTERVAL - (time.monotonic() - batch_started))
            ready, _, _ = select.select([fd], [], [], timeout)
            chunk = os.read(fd, 65536) if ready else None
            if chunk == b"":  # EOF
                if buffer:
                    batch.append(buffer.decode("utf-8", "replace"))
                if batch:
                    self.send({"t": "lines", "stream": stream, "lines": batch})
                return
            if chunk:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                if complete:
                    if not batch:
                        batch_started = time.monotonic()
                    for line in complete:
                        batch.append(line.decode("utf-8", "replace"))
                        batch_bytes += len(line)
            if batch and (batch_bytes >= MAX_BATCH_BYTES
                          or time.monotonic() - batch_started >= FLUSH_INTERVAL):
                self.send({"t": "lines", "stream": stream, "lines": batch})
                batch, batch_bytes = [], 0

    def pump_events(self, pipe):
        for raw in pipe:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.send(event)


# --- the task ---------------------------------------------------------------------------------

def _stop_group(proc, grace=STOP_GRACE_SECONDS):
    """End the rank's whole process group: SIGTERM, a grace period, then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Rendezvous:
    """Horovod's HTTP rendezvous server for one run, on every IPv4 interface, a free port.

    Horovod's own `RendezvousServer` takes up to half a second to stop (its serve loop polls at
    0.5 s) and leaves its socket open; this one stops at once and closes it.
    """

    POLL_SECONDS = 0.05

    def __init__(self, plan):
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
        self.httpd = RendezvousHTTPServer(("0.0.0.0", 0), RendezvousHandler, 0)
        self.httpd.init(plan)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       args=(self.POLL_SECONDS,), name="hvd-magic-rendezvous",
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class _DriverLink:
    """The task's connection to the driver: events out; ``stop``, ``dump`` and the rendezvous
    port in. Losing the connection counts as ``stop``: nobody is left to use the rank's work."""

    def __init__(self, settings, rank):
        self.proc = None
        self.port = None
        self.stopping = threading.Event()
        self._rendezvous = threading.Event()
        self.client = EventClient(settings.events_address, settings.token,
                                  on_message=self._on_message)
        self.forward = _Forwarder(self.client, rank)

    def _on_message(self, msg):
        kind = msg.get("t")
        if kind in ("stop", "closed"):
            self.stopping.set()
            self._rendezvous.set()
            if self.proc is not None:
                threading.Thread(target=_stop_group, args=(self.proc,), daemon=True).start()
        elif kind == "rendezvous":
            self.port = int(msg["port"])
            self._rendezvous.set()
        elif kind == "dump" and self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)

    def wait_rendezvous(self, timeout):
        """Task 0's rendezvous port, relayed by the driver; None if the run stopped first."""
        if not self._rendezvous.wait(timeout) or self.stopping.is_set():
            return None
        return self.port

    def close(self):
        self.client.close()


def run_task(settings: TaskSettings, coord: Coordinator):
    if coord.attempt > 0 and not settings.allow_retry:
        return (None, "retried", {
            "partition": coord.partition_id, "attempt": coord.attempt,
            "message": "Spark re-attempted the barrier stage after a failure; hvd_magic refuses to "
                       "start training over silently (pass --retries N to allow it)."})

    # Hosts as the cluster knows the executors: tasks of one executor host share local ranks.
    # Every task computes the same plan from them, so no task needs to hear from another.
    hosts = [coord.task_address(i) for i in range(settings.np)]
    plan, slots = host_plan(hosts, settings.np)
    slot = slots[coord.partition_id]
    host = socket.gethostname()
    link = _DriverLink(settings, slot.rank)
    rendezvous = None
    try:
        if coord.partition_id == 0:
            # Task 0 starts Horovod's rendezvous server; the driver relays its port to the other
            # tasks over the event channel (milliseconds, where a Spark barrier sync takes ~1 s).
            rendezvous = _Rendezvous(plan)
            link.forward.send({"t": "rendezvous", "port": rendezvous.port})
        timeout = float(settings.horovod_env.get("HOROVOD_GLOO_TIMEOUT_SECONDS", 300))
        port = link.wait_rendezvous(timeout)
        if port is None:
            link.forward.send({"t": "exit", "code": None, "status": "stopped", "summary": None})
            return (slot.rank, "stopped", {"rank": slot.rank, "host": host, "code": None})
        rendezvous_ip = _resolve(hosts[0])
        env = dict(os.environ)
        env.update(settings.horovod_env)
        env.update(settings.extra_env)
        env.update(horovod_rank_env(slot, settings.np, rendezvous_ip, port,
                                    _iface_of(_local_ip_towards(rendezvous_ip))))
        gpus = visible_devices(coord.gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        return _run_rank(settings, slot, env, host, gpus, link, executor=coord.executor(),
                         partition=coord.partition_id)
    finally:
        link.close()
        if rendezvous is not None:
            rendezvous.stop()


def _write_job(workdir, settings):
    """The job file for the rank: small values inline, large ones fetched from their broadcast."""
    import pickle
    job = pickle.loads(settings.job)
    for name, ref in settings.broadcast_kwargs.items():
        job["kwargs"][name] = ref.value if hasattr(ref, "value") else ref
    with open(os.path.join(workdir, "job.pkl"), "wb") as f:
        pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)


def _run_rank(settings, slot, env, host, gpus, link, executor=None, partition=None):
    rank = slot.rank
    forward = link.forward
    workdir = tempfile.mkdtemp(prefix=f"hvd_magic-{settings.run_id}-rank{rank}-")
    proc = None
    try:
        _write_job(workdir, settings)
        events_r, events_w = os.pipe()
        env["HVD_MAGIC_EVENT_FD"] = str(events_w)
        env["HVD_MAGIC_PARENT_PID"] = str(os.getpid())
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        timeline_path = os.path.join(workdir, "timeline.json")
        env["HVD_MAGIC_TIMELINE_PATH"] = timeline_path
        # A full timeline when asked for; otherwise DYNAMIC, so `hvd_magic.timeline()` can record
        # a window (cheap with our patched writer thread, which sleeps when idle).
        env.setdefault("HOROVOD_TIMELINE", timeline_path if settings.timeline else "DYNAMIC")
        cwd = settings.cwd if settings.cwd and os.path.isdir(settings.cwd) else workdir
        proc = link.proc = subprocess.Popen(
            [sys.executable, "-m", "hvd_magic.rank", workdir],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(events_w,), env=env, cwd=cwd, start_new_session=True)
        os.close(events_w)
        if link.stopping.is_set():  # the stop came while the rank was being started
            threading.Thread(target=_stop_group, args=(proc,), daemon=True).start()
        forward.send({"t": "state", "state": "starting", "host": host, "pid": proc.pid,
                      "local_rank": slot.local_rank, "gpus": gpus, "executor": executor,
                      "partition": partition})
        with os.fdopen(events_r, "rb") as events_pipe:
            pumps = [
                threading.Thread(target=forward.pump_lines, args=(proc.stdout, "stdout"), daemon=True),
                threading.Thread(target=forward.pump_lines, args=(proc.stderr, "stderr"), daemon=True),
                threading.Thread(target=forward.pump_events, args=(events_pipe,), daemon=True),
            ]
            for p in pumps:
                p.start()
            code = proc.wait()
            _kill_group(proc.pid)  # whatever the rank left running (its session) goes with it
            for p in pumps:
                p.join(timeout=10)
        if os.path.exists(timeline_path):  # rank 0 wrote one: it comes back, whatever happened
            _send_file(forward, timeline_path, "timeline")
        outcome = _outcome(workdir, code, rank, host, link.stopping.is_set(), env)
        forward.send({"t": "exit", "code": code, "status": outcome[1],
                      "summary": outcome[2] if outcome[1] != "ok" else None})
        return outcome
    finally:
        if proc is not None:
            _stop_group(proc, grace=0.5)
        shutil.rmtree(workdir, ignore_errors=True)


def _send_file(forward, path, kind, chunk_chars=1 << 20):
    """Send a text file to the driver as ordered `file` events (each under the frame cap)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        seq = 0
        while True:
            chunk = f.read(chunk_chars)
            forward.send({"t": "file", "kind": kind, "seq": seq, "data": chunk, "last": not chunk})
            if not chunk:
                return
            seq += 1


def _outcome(workdir, code, rank, host, stopped, env):
    result_path = os.path.join(workdir, "result.pkl")
    error_path = os.path.join(workdir, "error.json")
    if code == 0 and os.path.exists(result_path):
        with open(result_path, "rb") as f:
            return (rank, "ok", f.read())
    info = {"rank": rank, "host": host, "code": code,
            "rendezvous": "{HOROVOD_GLOO_RENDEZVOUS_ADDR}:{HOROVOD_GLOO_RENDEZVOUS_PORT}".format(**env),
            "iface": env["HOROVOD_GLOO_IFACE"]}
    if os.path.exists(error_path):
        with open(error_path) as f:
            info.update(json.load(f))
        return (rank, "error", info)
    if stopped:
        return (rank, "stopped", info)
    if code < 0:
        info["signal"] = signal.Signals(-code).name
    return (rank, "died", info)
