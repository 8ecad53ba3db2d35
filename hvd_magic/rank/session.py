"""A rank of a warm session: ``python -m hvd_magic.rank WORKDIR --session``.

The process lives as long as the session and runs one cell after another in its own namespace,
so what a cell assigns (a model, an optimizer, Horovod's state) is there for the next one.

From its task, on stdin, length-prefixed pickled jobs: ``{"cell", "code", "kwargs", "assigns",
"sources", "export"}`` (None ends the session). For each it:
- puts the notebook's values into the namespace, except names an earlier cell assigned here
  (the rank's own value wins);
- puts back the frameworks' variables the rank started with that an earlier cell removed
  (`restore_framework_env`: Lightning's teardown deletes ``WORLD_SIZE``);
- in an elastic session, when the job says a rank was lost (``"reset"``), first resets Horovod
  (`reset_horovod`): the survivors form the smaller ring before the cell's code runs;
- runs the cell's code; an error keeps the rank in pdb first when the session debugs
  (`hvd_magic.rank.debugger`); a KeyboardInterrupt (the task's SIGINT: Cancel, Ctrl-C, a timeout) ends
  the cell, not the session;
- flushes stdout and stderr, marks their end with `END_OF_CELL` (so the task knows every line of
  this cell has been forwarded), writes the value or the error to ``WORKDIR/cell-<n>.*`` and
  sends a ``cell_done`` event.

While no cell's code runs (before the first cell, between cells, during a reset), what the
process writes to stdout and stderr, any thread's, Horovod's C++ lines too, goes to the
session's log, not to a cell (`BetweenCells`): a survivor's old ring failing after a peer died
says so whenever it notices, and that is no line of the next cell.
"""

import builtins
import contextlib
import json
import marshal
import os
import pickle
import select
import signal
import struct
import sys
import tempfile
import threading

from ..payload import cloud_dumps
from . import debugger, elastic_world, reporting, stream

END_OF_CELL = "\x00hvd_magic end of cell\x00"
# Names the rank's frameworks' variables (`hvd_magic.frameworks`), comma-separated.
FRAMEWORK_VARS = "HVD_MAGIC_FRAMEWORK_VARS"
VALUE_NAME = "__hvd_magic_value__"
_HEADER = struct.Struct("!I")
# Horovod's framework modules: each has its own C++ library, initialised on its own.
FRAMEWORKS = ("horovod.torch", "horovod.tensorflow", "horovod.mxnet")
_released = set()   # frameworks shut down after a lost peer (`release_horovod`), to init again
_running = False    # inside a cell's code: the only place an interrupt may land


def _interrupt(signum, frame):
    # An interrupt meant for a cell can arrive just after it ended (the driver decided to stop
    # while this rank was reporting its end): outside a cell's code it is ignored, so that it
    # never breaks the end of a cell or the wait for the next one.
    if _running:
        raise KeyboardInterrupt


class BetweenCells:
    """The rank's stdout and stderr while no cell's code runs: file descriptors 1 and 2 point to
    pipes of this process, whose lines a thread sends as ``lines`` events marked
    ``between_cells`` (the driver writes them to the session's log, whatever cell runs when they
    arrive). The switch is of the descriptors themselves, in this thread, at a cell's edges: a
    line is the cell's if and only if it was written while the cell's code ran, whichever
    thread (or C++ library) wrote it and whenever it reaches the driver."""

    def __init__(self):
        self.pipes = {fd: os.pipe() for fd in (1, 2)}   # fd -> (read end, write end)
        self.saved = {}              # fd -> a copy of the task's pipe while we hold fd
        threading.Thread(target=self._pump, daemon=True, name="hvd_magic between cells").start()

    def begin(self):
        """From now on no cell runs: what anyone writes goes to the session's log."""
        if self.saved:
            return
        _flush()
        for fd, (_, write) in self.pipes.items():
            self.saved[fd] = os.dup(fd)
            os.dup2(write, fd)

    def end(self):
        """A cell's code runs from now on: its lines go to the task, which sends them as the
        cell's."""
        if not self.saved:
            return
        _flush()
        for fd, saved in self.saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self.saved = {}

    def mark_end_of_cell(self):
        """`END_OF_CELL` on the task's own stdout and stderr (after `begin`): every line the
        cell wrote is before it, and nothing written after it reaches the cell."""
        for saved in self.saved.values():
            data = (END_OF_CELL + "\n").encode()  # after a partial line too: the task splits it off
            while data:
                data = data[os.write(saved, data):]

    def _pump(self):
        streams = {read: ("stdout" if fd == 1 else "stderr") for fd, (read, _) in self.pipes.items()}
        partial = dict.fromkeys(streams, b"")
        while True:
            waiting = any(partial.values())
            ready, _, _ = select.select(list(streams), [], [], 0.2 if waiting else None)
            for read in streams if not ready else ready:
                chunk = os.read(read, 65536) if ready else b""
                *lines, partial[read] = (partial[read] + chunk).split(b"\n")
                if not ready and partial[read]:  # a partial line, 0.2 s old: as it is
                    lines, partial[read] = lines + [partial[read]], b""
                if lines:
                    reporting.send({"t": "lines", "stream": streams[read], "between_cells": True,
                                    "lines": [x.decode("utf-8", "replace") for x in lines]})


def _flush():
    for out in (sys.stdout, sys.stderr):
        try:
            out.flush()
        except (OSError, ValueError):  # (a stream the user's code closed or replaced)
            pass


def read_job(pipe):
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None  # the task closed stdin: the session ends
    (size,) = _HEADER.unpack(header)
    data = pipe.read(size)
    return pickle.loads(data) if data else None


def write_job(pipe, job_bytes):
    """The task's side of `read_job` (job_bytes: the pickled job, or b"" to end the session)."""
    pipe.write(_HEADER.pack(len(job_bytes)) + job_bytes)
    pipe.flush()


def reset_horovod(peers=()):
    """A rank of the session was lost: join the survivors' new ring, as Horovod's own
    `hvd.elastic.run` does after a failure. A framework this process initialised is shut down
    and initialised again: with ``HOROVOD_ELASTIC=1`` that second `init()` asks the elastic
    driver for its new rank and size (its rendezvous records this worker ready; the ring forms
    once every survivor has). A process that never initialised Horovod asks the driver itself
    and keeps the answer in its environment, where its first `init()` reads it.

    `peers`: (host, pid) of every survivor. The old ring's connections to those of this machine
    are closed first (`close_old_ring`). What Horovod says meanwhile about the lost peer goes to
    this rank's log only (`log_only_stderr`): it is the reset working, not news for the cell."""
    done = False
    _leave_old_ring(peers)
    for name in FRAMEWORKS:
        module = sys.modules.get(name)
        if module is None or name not in _released:
            continue
        module.init()
        done = True
    _released.clear()
    if not done:
        _ask_rank_and_size()


def close_old_ring(peers):
    """Shut down this process's connections to the other survivors of this machine: the old
    ring's Gloo pairs. A survivor's Horovod can be left waiting on a peer of the old ring, which
    its shutdown then waits for, until Gloo's timeout (60 s by default); with those connections
    gone it fails at once and is ready to form the new ring, as an elastic run's ranks are."""
    import socket

    import psutil

    here, me = socket.gethostname(), os.getpid()
    theirs = set()
    for host, pid in peers or ():
        if host == here and pid != me:
            try:
                theirs.update(c.laddr for c in psutil.Process(pid).net_connections("tcp"))
            except psutil.Error:  # (it ended meanwhile: its connections are closed)
                continue
    for c in psutil.Process(me).net_connections("tcp"):
        if c.raddr and c.raddr in theirs:
            try:
                with socket.socket(fileno=os.dup(c.fd)) as conn:
                    conn.shutdown(socket.SHUT_RDWR)
            except OSError:  # Gloo closed it meanwhile
                pass


@contextlib.contextmanager
def log_only_stderr():
    """What this process writes to its stderr (Horovod's C++ lines too) goes to the rank's
    log, as ``lines`` marked ``log_only`` (`hvd_magic.driver.apply`), not under the cell."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines()
            if lines:
                reporting.send({"t": "lines", "stream": "stderr", "lines": lines,
                                "log_only": True})


def release_horovod(exc, peers=()):
    """A collective of an elastic session's cell failed (a peer was lost): close the old ring's
    connections to the other survivors (`peers`, as for `reset_horovod`) and shut Horovod down at
    once. Horovod's shutdown after its background loop failed leaves Gloo's connections open, and
    a survivor waiting on this rank inside a collective would wait for them until the Gloo
    timeout (60 s by default); closed, it fails now and its cell ends too. `reset_horovod`
    initialises Horovod again before the next cell."""
    if type(exc).__name__ == "HorovodInternalError" and os.environ.get("HOROVOD_ELASTIC") == "1":
        _leave_old_ring(peers)


def _leave_old_ring(peers):
    """Close the old ring's connections to `peers` of this machine, then shut down each
    framework this process initialised (to be initialised again by `reset_horovod`)."""
    with log_only_stderr():
        close_old_ring(peers)
        for name in FRAMEWORKS:
            module = sys.modules.get(name)
            if module is not None and module.is_initialized():
                module.shutdown()
                _released.add(name)


def _ask_rank_and_size():
    from urllib.request import urlopen

    env = os.environ
    url = (f"http://{env['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{env['HOROVOD_GLOO_RENDEZVOUS_PORT']}"
           f"/rank_and_size/{env['HOROVOD_HOSTNAME']}:{env.get('HOROVOD_LOCAL_RANK', '0')}")
    with urlopen(url) as answer:  # blocks until every survivor asked (Horovod's barrier)
        values = answer.read().decode().split(",")
    if values[0] == "-1":
        raise RuntimeError("this rank was removed from the elastic session's ring")
    for name, value in zip(("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                            "CROSS_SIZE"), values):
        env[f"HOROVOD_{name}"] = value


def framework_env():
    """The frameworks' variables this rank process started with (torchrun's, Horovod's...)."""
    names = os.environ.get(FRAMEWORK_VARS, "").split(",")
    return {name: os.environ[name] for name in names if name in os.environ}


def restore_framework_env(started):
    """Put back each of `started`'s variables that a cell removed: a framework's teardown may
    (Lightning's `LightningEnvironment.teardown` deletes ``WORLD_SIZE``), and the next cell's
    ``init_process_group`` would then fail. One a cell changed is left as it is (an elastic
    reset gives Horovod's ranks new values on purpose)."""
    for name, value in started.items():
        os.environ.setdefault(name, value)


def serve(workdir, error_record, exports, register_source, install_modules):
    global _running
    import cloudpickle  # noqa: F401  (the jobs and values unpickle with it)

    signal.signal(signal.SIGINT, _interrupt)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    assigned = set()      # names a cell assigned on this rank: they win over notebook values
    jobs = sys.stdin.buffer
    started_env = framework_env()
    debugger.next_job = lambda: read_job(jobs)  # (pdb's commands come there too)
    between = BetweenCells()
    between.begin()
    reporting.state("ready", fresh=reporting.fresh())
    while True:
        job = read_job(jobs)
        if job is None:
            return 0
        cell = job["cell"]
        debugger.hold_others(False)  # (a hold of an earlier cell never outlives it)
        for filename, source in job.get("sources", {}).items():
            register_source(filename, source)
        install_modules(job.get("modules"), os.path.join(workdir, "modules"))
        if job.get("data") is not None:  # this cell's --data; later cells keep reading it
            stream.use_plan(job["data"])
        restore_framework_env(started_env)
        reporting.state("running", cell=cell)
        status, summary, payload = "ok", None, b""
        try:
            _running = True
            try:
                if elastic_world.active():  # an elastic torch session: into its newest world
                    elastic_world.world().refresh()
                elif job.get("reset"):  # (still between cells: the old ring's last words are no
                    reset_horovod(job.get("peers"))  # line of this cell, whichever rank says them)
                _cell_streams(between)
                for name, data in job["kwargs"].items():
                    if name not in assigned:
                        namespace[name] = pickle.loads(data)
                namespace.pop(VALUE_NAME, None)
                exec(marshal.loads(job["code"]), namespace)
            finally:
                _running = False
                assigned.update(job["assigns"])
            value = namespace.pop(VALUE_NAME, None)
            payload = cloud_dumps((value, exports(namespace, job.get("export", ()))))
        except KeyboardInterrupt:
            status, summary = "stopped", {"type": "KeyboardInterrupt",
                                          "message": "interrupted; the session keeps its state"}
        except BaseException as exc:  # the user's code may raise anything, SystemExit included
            release_horovod(exc, job.get("peers"))
            if job.get("debug"):  # held at the exception until the notebook's `c` or `q`
                debugger.hold(f"{type(exc).__name__}: {exc}", tb=exc.__traceback__)
            status = "error"
            summary = error_record(exc)  # its frames and locals too, for %debug
        _end_cell(workdir, cell, status, summary, payload, between)


def _cell_streams(between):
    """`between.end()`, which an interrupt must not cut half-way (the task repeats an interrupt
    until the cell ends: none is lost)."""
    global _running
    _running = False
    try:
        between.end()
    finally:
        _running = True


def _end_cell(workdir, cell, status, summary, payload, between):
    between.begin()
    between.mark_end_of_cell()
    path = os.path.join(workdir, f"cell-{cell}")
    with open(path + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(path + ".tmp", path)
    reporting.flush()
    reporting.send({"t": "cell_done", "cell": cell, "status": status,
                    "summary": json.loads(json.dumps(summary, default=str)), "path": path})
