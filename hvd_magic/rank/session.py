"""A rank of a warm session: ``python -m hvd_magic.rank WORKDIR --session``.

The process lives as long as the session and runs one cell after another in its own namespace,
so what a cell assigns (a model, an optimizer, Horovod's state) is there for the next one.

From its task, on stdin, length-prefixed pickled jobs: ``{"cell", "code", "kwargs", "assigns",
"sources", "export"}`` (None ends the session). For each it:
- puts the notebook's values into the namespace, except names an earlier cell assigned here
  (the rank's own value wins);
- runs the cell's code; a KeyboardInterrupt (the task's SIGINT: Cancel, Ctrl-C, a timeout) ends
  the cell, not the session;
- flushes stdout and stderr, marks their end with `END_OF_CELL` (so the task knows every line of
  this cell has been forwarded), writes the value or the error to ``WORKDIR/cell-<n>.*`` and
  sends a ``cell_done`` event.
"""

import builtins
import json
import marshal
import os
import pickle
import signal
import struct
import sys

from . import reporting, stream

END_OF_CELL = "\x00hvd_magic end of cell\x00"
VALUE_NAME = "__hvd_magic_value__"
_HEADER = struct.Struct("!I")
_running = False    # inside a cell's code: the only place an interrupt may land


def _interrupt(signum, frame):
    # An interrupt meant for a cell can arrive just after it ended (the driver decided to stop
    # while this rank was reporting its end): outside a cell's code it is ignored, so that it
    # never breaks the end of a cell or the wait for the next one.
    if _running:
        raise KeyboardInterrupt


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


def serve(workdir, user_traceback, exports, register_source, install_modules):
    global _running
    import cloudpickle

    signal.signal(signal.SIGINT, _interrupt)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    assigned = set()      # names a cell assigned on this rank: they win over notebook values
    jobs = sys.stdin.buffer
    reporting.state("ready")
    while True:
        job = read_job(jobs)
        if job is None:
            return 0
        cell = job["cell"]
        for filename, source in job.get("sources", {}).items():
            register_source(filename, source)
        install_modules(job.get("modules"), os.path.join(workdir, "modules"))
        if job.get("data") is not None:  # this cell's --data; later cells keep reading it
            stream.use_plan(job["data"])
        reporting.state("running", cell=cell)
        status, summary, payload = "ok", None, b""
        try:
            _running = True
            try:
                for name, data in job["kwargs"].items():
                    if name not in assigned:
                        namespace[name] = pickle.loads(data)
                namespace.pop(VALUE_NAME, None)
                exec(marshal.loads(job["code"]), namespace)
            finally:
                _running = False
                assigned.update(job["assigns"])
            value = namespace.pop(VALUE_NAME, None)
            payload = cloudpickle.dumps((value, exports(namespace, job.get("export", ()))))
        except KeyboardInterrupt:
            status, summary = "stopped", {"type": "KeyboardInterrupt",
                                          "message": "interrupted; the session keeps its state"}
        except BaseException as exc:  # the user's code may raise anything, SystemExit included
            status = "error"
            summary = {"type": type(exc).__name__, "module": type(exc).__module__,
                       "message": str(exc), "traceback": user_traceback(exc)}
        _end_cell(workdir, cell, status, summary, payload)


def _end_cell(workdir, cell, status, summary, payload):
    for out in (sys.stdout, sys.stderr):
        out.write(END_OF_CELL + "\n")  # after a partial line too: the task splits it off
        out.flush()
    path = os.path.join(workdir, f"cell-{cell}")
    with open(path + ".tmp", "wb") as f:
        f.write(payload)
    os.replace(path + ".tmp", path)
    reporting.flush()
    reporting.send({"t": "cell_done", "cell": cell, "status": status,
                    "summary": json.loads(json.dumps(summary, default=str)), "path": path})
