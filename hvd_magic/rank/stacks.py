"""Every thread's Python stack of this rank, when its task asks (``Run.stacks()``).

Two ways, because a rank can be stuck in two ways:
- a helper thread blocks reading the task's request pipe (``HVD_MAGIC_PROBE_FD``); a second one
  answers each request with `snapshot()` (``sys._current_frames()``: every thread, with the
  user's frames' locals, each a ``repr`` the user's class may make slow) as a ``stacks`` event.
  They need the GIL, which a rank waiting in Horovod's, Gloo's or torch's collectives has
  released. The same pipe carries the driver's word on an elastic run's members
  (`hvd_magic.rank.elastic_world`) and on a peer held in pdb: the reading thread hands those on
  at once, never behind a snapshot (a slow ``__repr__`` during a stall's report would delay the
  ``lost`` that ends a collective's wait);
- a rank that holds the GIL for good (a C extension that spins) cannot run that thread, so the
  task falls back to `STACK_SIGNAL`: faulthandler, registered here, writes every thread's frames
  (no locals) from the signal handler itself, GIL or not, into a regular file the task reads
  (``HVD_MAGIC_STACKS_FILE``; a pipe could block the handler). Not SIGUSR1: Lightning uses it.

Which frames are the user's is decided on the rank, where the paths are the rank's
(`hvd_magic.rank.frames.is_users`).
"""

import json
import os
import queue
import signal
import sys
import threading

from . import debugger, elastic_world, jax_waits, reporting, trial
from ..compat import torch as torch_compat
from .frames import bounded_locals, frame_record

STACK_SIGNAL = signal.SIGRTMIN + 4
THREAD_NAME = "hvd-magic-stacks"
SNAPSHOT_THREAD = "hvd-magic-snapshots"
MAX_FRAMES = 200         # per thread: the outermost 20 (where the user's code is) and the innermost
LOCALS_PER_FRAME = 20

def snapshot(skip=()):
    """Every thread's stack but those of `skip` (thread idents): [{"name", "main", "frames":
    [outermost..innermost], "locals": {index: {name: repr}} for the user's frames}]."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident in skip:
            continue
        chain = []
        while frame is not None:
            chain.append(frame)
            frame = frame.f_back
        chain.reverse()
        if len(chain) > MAX_FRAMES:
            chain = chain[:20] + chain[20 - MAX_FRAMES:]
        frames = [frame_record(f.f_code.co_filename, f.f_lineno, f.f_code.co_name) for f in chain]
        local_values = {str(i): bounded_locals(f.f_locals, LOCALS_PER_FRAME)
                        for i, f in enumerate(chain) if frames[i][4]}
        threads.append({"name": names.get(ident, hex(ident)), "main": ident == main,
                        "frames": frames, "locals": local_values})
    threads.sort(key=lambda t: not t["main"])
    return threads


def collectives():
    """Where this rank is in each torch.distributed group's collectives: the newest entry of
    torch's Flight Recorder (torch 2.5 and later records every collective it issues, Gloo's
    and NCCL's, DDP's included) per group, as [{"group", "seq", "op"}]; [] where no group is
    made, or where torch has no Flight Recorder (`compat.torch` says so once)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return []
        newest = {}
        for entry in torch_compat.flight_recorder_entries() or ():
            group = entry.get("process_group") or [entry.get("pg_id"), ""]
            name = str(group[1] or group[0])
            if entry.get("collective_seq_id", 0) >= newest.get(name, {}).get("seq", -1):
                newest[name] = {"group": name, "seq": entry.get("collective_seq_id", 0),
                                "op": entry.get("profiling_name", "?")}
        return list(newest.values())
    except RuntimeError:  # a group being torn down as it was read
        return []


def _serve(fd):
    """The reading thread: one request per line. The driver's words are handed on here; a
    stacks request id goes to the snapshot thread (`_answer`, started by the first: a rank
    never asked has no more threads in a crash's dump)."""
    asked, answering = queue.SimpleQueue(), None
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        buffer = b""
        while True:
            chunk = pipe.read(256)
            if not chunk:  # the task went away
                asked.put(None)
                return
            buffer += chunk
            *requests, buffer = buffer.split(b"\n")
            for request in requests:
                if request.startswith(b"{"):  # the driver's word on an elastic world, a trial
                    message = json.loads(request)
                    if message.get("t") == "trial":  # (a sweep's early stop: rank/trial.py)
                        trial.heard(message)
                    else:
                        elastic_world.heard(request)
                    continue
                if request in (b"hold", b"release"):  # a peer is held in pdb, or no longer
                    debugger.hold_others(request == b"hold")
                    continue
                asked.put(request)
                if answering is None:
                    answering = threading.Thread(target=_answer, name=SNAPSHOT_THREAD,
                                                 args=(asked, threading.get_ident()), daemon=True)
                    answering.start()


def _answer(asked, reader):
    """The snapshot thread: each stacks request answered with every thread's stack but the
    probe's own two."""
    skip = (reader, threading.get_ident())
    while True:
        request = asked.get()
        if request is None:
            return
        try:
            threads = snapshot(skip=skip)
        except Exception as exc:  # a frame's locals that cannot be read, say
            threads, error = [], f"{type(exc).__name__}: {exc}"
        else:
            error = None
        reporting.send({"t": "stacks", "id": request.decode(errors="replace"),
                        "how": "python", "threads": threads, "error": error,
                        "collectives": collectives() + jax_waits.jax_collectives()})


def install(environ=None):
    """Answer the task's requests (a helper thread), and `STACK_SIGNAL` (faulthandler).

    ``HVD_MAGIC_NO_PROBE=1`` leaves both out: a switch for bench/bench_stacks.py only (training
    speed with and without them), not for users: such a rank's stacks are never there."""
    import faulthandler

    environ = os.environ if environ is None else environ
    if environ.get("HVD_MAGIC_NO_PROBE") == "1":
        return
    path = environ.get("HVD_MAGIC_STACKS_FILE")
    if path:
        # appended to: the task reads what each signal adds after the size it saw before. Made
        # under another name and renamed once registered: the task signals only a rank whose
        # file exists (the signal's default action, before that, ends the process)
        dump_file = open(path + ".part", "a")
        install.dump_file = dump_file  # kept open: faulthandler keeps only its descriptor
        faulthandler.register(STACK_SIGNAL, file=dump_file, all_threads=True, chain=False)
        os.rename(path + ".part", path)
    fd = environ.get("HVD_MAGIC_PROBE_FD")
    if fd:
        threading.Thread(target=_serve, args=(int(fd),), name=THREAD_NAME, daemon=True).start()
