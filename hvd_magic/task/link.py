"""The task's connection to the driver: the rank's lines and events out, in batches; ``stop``,
``stacks`` (`hvd_magic.task.stacks`) and the frameworks' relayed rendezvous (ports) in."""

import base64
import codecs
import json
import os
import signal
import threading
import time

from ..events import EventClient
from ..rank import session as rank_session
from .stopping import stop_group

END_OF_CELL = rank_session.END_OF_CELL.encode()

# How long output may sit in the task before it is sent, and how much at most per frame.
FLUSH_INTERVAL = 0.05
MAX_BATCH_BYTES = 256 * 1024


class Forwarder:
    """Sends a rank's lines and events to the driver in batches, in order, never splitting lines."""

    def __init__(self, client, rank):
        self.client = client
        self.rank = rank
        self.lock = threading.Lock()
        self.failed = False
        self.on_cell_done = None     # a warm session's handler of the rank's `cell_done` event
        self.on_stacks = None        # the rank's answer to a stacks request (`StackProbe.answer`)
        # one release per end-of-cell marker seen on each stream (warm sessions)
        self.cell_ends = {"stdout": threading.Semaphore(0), "stderr": threading.Semaphore(0)}

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
                        if line.endswith(END_OF_CELL):  # a session's cell ended: all sent now
                            if line[:-len(END_OF_CELL)]:
                                batch.append(line[:-len(END_OF_CELL)].decode("utf-8", "replace"))
                            if batch:
                                self.send({"t": "lines", "stream": stream, "lines": batch})
                            batch, batch_bytes = [], 0
                            self.cell_ends[stream].release()
                            continue
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
            if not isinstance(event, dict):
                continue
            if event.get("t") == "cell_done" and self.on_cell_done is not None:
                self.on_cell_done(event)  # in this thread: ordered after the cell's events
            elif event.get("t") == "stacks" and self.on_stacks is not None:
                self.on_stacks(event)
            else:
                self.send(event)



class DriverLink:
    """The task's connection to the driver: events out; ``stop``, ``stacks`` and what the
    tasks serve and reserve for the frameworks' rendezvous (their ports) in. Losing the
    connection counts as ``stop``: nobody is left to use the rank's work."""

    def __init__(self, settings, rank, client=None):
        self.proc = None
        self.probe = None            # the rank's `StackProbe`, while it runs
        self.relayed = None          # what `frameworks.Gathering` relayed
        self.session = None          # a warm session's `SessionRank`, which takes cells
        self.on_order = None         # an elastic slot's handler of the driver's orders
        self.stopping = threading.Event()
        self.signalled = set()       # the signals the stop sent the rank (`stop_group`)
        self.closing = False         # this task closes the connection itself
        self._rendezvous = threading.Event()
        if client is None:
            client = EventClient(settings.events_address, settings.token)
        client.start_reading(self._on_message)
        self.client = client
        self.forward = Forwarder(self.client, rank)

    def _on_message(self, msg):
        kind = msg.get("t")
        if kind in ("stop", "closed"):
            self.stop_rank()
        elif kind == "rendezvous":
            self.relayed = msg.get("relay") if isinstance(msg.get("relay"), dict) else {}
            self._rendezvous.set()
        elif kind == "stacks" and self.probe is not None:
            threading.Thread(target=self.probe.request, args=(msg.get("id"),),
                             name="hvd-magic-stacks", daemon=True).start()
        elif kind == "hold" and self.probe is not None:  # a peer is held in pdb, or let go
            self.probe.tell("hold" if msg.get("on") else "release")
        elif kind in ("cell", "cell_part", "interrupt", "debug") and self.session is not None:
            self.session.on_message(msg)
        elif kind == "clock":  # the driver's clock against this host's (timelines/ranks.py)
            self.forward.send({"t": "clock", "id": msg.get("id"), "sent": msg.get("sent"),
                               "here": time.time()})
        elif kind == "trial" and self.probe is not None:  # a sweep's early stop (rank/trial.py)
            self.probe.tell(json.dumps(msg))
        elif kind in ("lost", "reform", "world", "leave") and self.probe is not None:
            if msg.get("slot") in (None, self.forward.rank):  # an elastic world (rank/elastic_world.py)
                self.probe.tell(json.dumps(msg))
        elif kind in ("worker", "stop_worker", "slots_done") and self.on_order is not None:
            self.on_order(msg)
        elif kind == "frozen" and msg.get("slot") == self.forward.rank:
            self.kill_frozen(msg.get("pid"))

    def kill_frozen(self, pid):
        """The driver gave up this elastic rank as frozen (`hvd_magic.driver.frozen`): its
        process group killed (SIGKILL ends a stopped process too), which ends it as a loss, not
        as a stop (the signal is not the stop's: `signalled`)."""
        proc = self.proc
        if proc is not None and proc.pid == pid and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop_rank(self):
        """Stop the rank (now, or as soon as it is started) and every wait of this task."""
        self.stopping.set()
        self._rendezvous.set()
        if self.proc is not None:
            threading.Thread(target=stop_group, args=(self.proc,),
                             kwargs={"sent": self.signalled}, daemon=True).start()

    def wait_rendezvous(self, timeout):
        """What the tasks serve and reserve (by framework: ports), relayed by the driver once
        every task sent its own; None if the run stopped first."""
        if not self._rendezvous.wait(timeout) or self.stopping.is_set():
            return None
        return self.relayed

    def close(self):
        self.closing = True  # (the "closed" this causes is no stop from the driver)
        self.client.close()


class FileStream:
    """A text file the rank writes (rank 0's timeline), sent to the driver as it grows.

    `follow` sends what is new every `EVERY` seconds until `close`, which sends the rest and a
    last, empty chunk. Chunks are ordered ``file`` events of at most `CHUNK` bytes; a file that
    is rewritten in place (a second ``hvd_magic.timeline()`` window) is sent again from the
    start, with ``seq`` 0, which tells the driver to start over.
    """

    EVERY = 1.0
    CHUNK = 1 << 20

    def __init__(self, forward, path, kind):
        self.forward = forward
        self.path = path
        self.kind = kind
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self._inode = None
        self._offset = 0
        self._seq = 0
        self._decoder = None

    def follow(self):
        while not self.closed.wait(self.EVERY):
            with self.lock:
                if not self.closed.is_set():
                    self._send_new(final=False)

    def close(self):
        self.closed.set()
        with self.lock:
            self._send_new(final=True)
            if self._inode is not None:
                self._send("", last=True)

    def _send_new(self, final):
        try:
            stat = os.stat(self.path)
        except OSError:
            return
        if stat.st_ino != self._inode or stat.st_size < self._offset:  # new, or rewritten
            self._inode, self._offset, self._seq = stat.st_ino, 0, 0
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with open(self.path, "rb") as f:
            end = stat.st_size
            if not final and end > self._offset:
                # Horovod keeps its timeline valid JSON by writing "]" after every event and
                # seeking back over it for the next: that byte is sent only at the end.
                f.seek(end - 1)
                if f.read(1) == b"]":
                    end -= 1
            f.seek(self._offset)
            while self._offset < end:
                data = f.read(min(self.CHUNK, end - self._offset))
                if not data:
                    return
                self._offset += len(data)
                self._send(self._decoder.decode(data, final=final and self._offset >= end))

    def _send(self, text, last=False):
        self.forward.send({"t": "file", "kind": self.kind, "seq": self._seq, "data": text,
                           "last": last})
        self._seq += 1


def send_folder(forward, folder, kind, chunk=1 << 20):
    """Every file under `folder` (binary: TensorBoard's event files), as ordered ``file`` events
    of base64 chunks with the file's path relative to `folder`."""
    for here, _, names in os.walk(folder):
        for name in sorted(names):
            path = os.path.join(here, name)
            rel = os.path.relpath(path, folder)
            with open(path, "rb") as f:
                seq = 0
                while True:
                    data = f.read(chunk)
                    forward.send({"t": "file", "kind": kind, "path": rel, "seq": seq,
                                  "data": base64.b64encode(data).decode(), "last": not data})
                    if not data:
                        break
                    seq += 1
