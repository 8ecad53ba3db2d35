"""The task's side of ``Run.stacks()``: ask its rank for every thread's stack, answer the driver.

The driver's ``stacks`` message (over the run's authenticated channel: no port of its own) comes
to `StackProbe.request`. It writes the request id to the rank's probe pipe, which a helper thread
of the rank answers with a ``stacks`` event (`hvd_magic.rank.stacks`), frames and locals. A rank
that does not answer within `PYTHON_WAIT` seconds holds the GIL (a C extension that spins): the
probe sends it `STACK_SIGNAL`, whose faulthandler writes every thread's frames to a file, and
reads them back. One that answers neither way by `DEADLINE` is reported as not answering; the
driver names it rather than waiting on it.
"""

import os
import re
import threading
import time

from ..rank.frames import frame_record
from ..rank.stacks import STACK_SIGNAL

PYTHON_WAIT = 0.6    # seconds for the rank's own thread to answer
DEADLINE = 1.5       # seconds for the whole answer, faulthandler's included

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text):
    """faulthandler's dump as the stacks' threads: [{"name", "main", "frames", "locals"}]."""
    threads = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append({"name": head[2], "main": False, "frames": [], "locals": {}})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].append(frame_record(frame[1], int(frame[2]), frame[3]))
    for thread in threads:
        thread["frames"].reverse()  # faulthandler writes the innermost first
        # the main thread's outermost frame is the interpreter's start of `python -m`
        thread["main"] = bool(thread["frames"]) and thread["frames"][0][2] == "_run_module_as_main"
    threads.sort(key=lambda t: not t["main"])
    return threads


class StackProbe:
    """Asks one rank process for its stacks; `answer` takes the rank's own ``stacks`` events."""

    def __init__(self, proc, probe_fd, dump_path, forward):
        self.proc = proc
        self.probe_fd = probe_fd
        self.dump_path = dump_path
        self.forward = forward
        self._lock = threading.Lock()
        self._answers = {}  # request id -> threading.Event, set when the rank answered

    def close(self):
        """The rank ended: its pipe is closed; later requests are answered as unanswered."""
        with self._lock:
            if self.probe_fd is not None:
                os.close(self.probe_fd)
                self.probe_fd = None

    def tell(self, word):
        """A word for the rank's helper thread: ``hold`` or ``release`` (rank/debugger.py), or
        a JSON line: the driver's word on an elastic world (rank/elastic_world.py)."""
        with self._lock:
            try:
                if self.probe_fd is not None:
                    os.write(self.probe_fd, word.encode() + b"\n")
            except OSError:  # the rank has ended
                pass

    def answer(self, event):
        """The rank's ``stacks`` event: to the driver, if its request is still waited on."""
        with self._lock:
            done = self._answers.pop(str(event.get("id")), None)
        if done is not None:
            done.set()
            self.forward.send(event)

    def request(self, request_id):
        """Ask (in a thread of the caller's) and make sure the driver hears one answer."""
        request_id = str(request_id)
        done = threading.Event()
        with self._lock:
            self._answers[request_id] = done
            try:  # under the lock: `close` may not free the descriptor meanwhile
                if self.probe_fd is not None:
                    os.write(self.probe_fd, request_id.encode() + b"\n")
            except OSError:  # the rank has ended
                pass
        if done.wait(PYTHON_WAIT):
            return
        threads = self._faulthandler(time.monotonic() + DEADLINE - PYTHON_WAIT)
        with self._lock:
            if self._answers.pop(request_id, None) is None:
                return  # the rank's thread answered meanwhile
        if threads:
            self.forward.send({"t": "stacks", "id": request_id, "how": "faulthandler",
                               "threads": threads, "error": None})
        else:
            self.forward.send({"t": "stacks", "id": request_id, "how": None, "threads": [],
                               "error": "the rank did not answer (neither its Python thread nor "
                                        "faulthandler)"})

    def _faulthandler(self, deadline):
        if self.proc.poll() is not None:
            return []
        try:  # the file appears once the rank's handler is registered (`rank.stacks.install`)
            before = os.path.getsize(self.dump_path)
        except OSError:  # not yet (a rank starting), or never: the signal would kill the rank
            return []
        try:
            os.kill(self.proc.pid, STACK_SIGNAL)
        except OSError:
            return []
        size = before
        while time.monotonic() < deadline:
            time.sleep(0.02)
            try:
                now = os.path.getsize(self.dump_path)
            except OSError:
                continue
            if now > before and now == size:  # grown, then still for one poll: written
                break
            size = now
        with open(self.dump_path, "rb") as f:  # (renamed, never removed, while the rank runs)
            f.seek(before)
            return parse_faulthandler(f.read().decode("utf-8", "replace"))
