"""A task's part in a warm session: cells in from the driver, each rank's ending of a cell out.

The task hands each ``cell`` message's job to its rank process (stdin) and turns ``interrupt``
into SIGINT, and a ``debug`` message for its rank into a command for the rank's pdb
(`hvd_magic.rank.debugger`) on the same stdin. SIGINT ends the running cell with a
KeyboardInterrupt and keeps the rank. The rank
ignores SIGINT outside a cell's code, so the task repeats it until the cell ends: an interrupt
that arrives before the rank started the cell still lands. When the
rank says a cell is done, the task waits until every line the cell printed has been forwarded
(the end-of-cell markers on stdout and stderr), then sends the cell's ``exit`` event with its
value: pickled bytes signed with the run's token (HMAC-SHA256), which the driver checks before
it unpickles them, as Jupyter does with its messages.

A job or a value larger than `PART_BYTES` travels in parts (``cell_part`` messages before the
``cell``, ``value_part`` events before the ``exit``): every frame stays under the event
channel's cap (`hvd_magic.events.MAX_FRAME`), whatever the size of a cell's values.
"""

import base64
import hashlib
import hmac
import os
import pickle
import signal
import threading

from ..rank.session import write_job

MARKER_WAIT_SECONDS = 5.0
INTERRUPT_EVERY = 0.5
PART_BYTES = 2 << 20   # base64 makes it 2.7 MiB, under the 4 MiB frame cap
SUMMARY_CHARS = 100_000  # of an error's message or traceback, so that its event fits a frame


def parts(data):
    """`data` as base64 strings of at most PART_BYTES each: all but the last go as parts."""
    chunks = [data[i:i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
    return [base64.b64encode(c).decode() for c in chunks]


def sign(token, payload):
    return hmac.new(token.encode(), payload, hashlib.sha256).hexdigest()


class SessionRank:
    def __init__(self, link, token):
        self.link = link
        self.token = token
        self.lock = threading.Lock()
        self.running = None          # the cell the rank was given and has not ended
        self._job_parts = []         # the next cell's job so far (cell_part messages)
        self.cell_ended = threading.Condition(self.lock)
        link.session = self
        link.forward.on_cell_done = self.cell_done

    def on_message(self, msg):
        proc = self.link.proc
        if proc is None or proc.poll() is not None:
            return
        if msg["t"] == "cell_part":
            self._job_parts.append(base64.b64decode(msg["data"]))
        elif msg["t"] == "cell":
            job = b"".join(self._job_parts) + base64.b64decode(msg["job"])
            self._job_parts = []
            with self.lock:  # one job at a time on the rank's stdin
                self.running = msg.get("cell")
                try:
                    write_job(proc.stdin, job)
                except (OSError, ValueError):
                    pass  # the rank died: its task reports how
        elif msg["t"] == "debug" and msg.get("rank") == self.link.forward.rank:
            # a command for the rank's pdb (rank/debugger.py), which reads it from stdin
            with self.lock:
                try:
                    write_job(proc.stdin, pickle.dumps({"debug": str(msg.get("cmd", ""))}))
                except (OSError, ValueError):
                    pass
        elif msg["t"] == "interrupt":
            threading.Thread(target=self._interrupt, args=(proc, msg.get("cell")),
                             daemon=True).start()

    def _interrupt(self, proc, cell):
        with self.lock:
            while self.running == cell and proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # (nothing if the rank ended since the poll)
                self.cell_ended.wait(INTERRUPT_EVERY)

    def cell_done(self, event):
        with self.lock:
            self.running = None
            self.cell_ended.notify_all()
        for stream in ("stdout", "stderr"):
            self.link.forward.cell_ends[stream].acquire(timeout=MARKER_WAIT_SECONDS)
        payload = b""
        path = str(event.get("path", ""))
        try:
            with open(path, "rb") as f:
                payload = f.read()
            os.remove(path)
        except OSError:
            pass
        exit_event = {"t": "exit", "cell": event.get("cell"), "code": None,
                      "status": event.get("status"), "summary": _bounded(event.get("summary"))}
        if event.get("status") == "ok":
            *before, last = parts(payload)
            for data in before:
                self.link.forward.send({"t": "value_part", "cell": event.get("cell"), "data": data})
            exit_event.update(value=last, sig=sign(self.token, payload))
        self.link.forward.send(exit_event)


def _bounded(summary):
    """An error summary whose long texts are cut to SUMMARY_CHARS, saying how much was cut."""
    if not isinstance(summary, dict):
        return summary
    return {key: f"{text[:SUMMARY_CHARS]}… ({len(text) - SUMMARY_CHARS} characters cut)"
            if isinstance(text, str) and len(text) > SUMMARY_CHARS else text
            for key, text in summary.items()}
