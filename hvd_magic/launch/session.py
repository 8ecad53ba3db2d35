"""Running one cell in a warm session: a `Launcher` whose ranks are already there.

The session (`hvd_magic.driver.session.Session`) keeps N rank processes alive behind one
long-lived launch and one event server. For a cell, `SessionLauncher` sends the job to every
task over that server and gives the driver loop a `CellChannel`: the session's router puts the
events of the running cell there, so the driver loop, the views, the run folder, results and
errors work exactly as for a one-off launch.

A cell's end on a rank is its ``exit`` event; its value comes with it, signed by the task with
the session's token, and is checked here before it is ever unpickled.
"""

import base64
import hmac
import pickle
import queue
import threading

from ..errors import LaunchError
from ..task.session import parts, sign
from .base import Launcher


class CellChannel:
    """What the driver loop needs of an event server, for one cell of a session."""

    def __init__(self, session, cell_id):
        self.session = session
        self.cell_id = cell_id
        self.events = queue.Queue()
        self.rejected = 0
        self.outcomes = {}           # rank -> (rank, status, payload)
        self._value_parts = {}       # rank -> the parts of its value so far (value_part events)
        self.ended = threading.Event()

    @property
    def port(self):
        return self.session.server.port

    @property
    def token(self):
        return self.session.server.token

    def deliver(self, event):
        """An event of this cell (from the session's router thread)."""
        if event.get("t") == "value_part":
            self._value_parts.setdefault(event["rank"], []).append(base64.b64decode(event["data"]))
            return
        if event.get("t") == "exit":
            self._exit(event)
        self.events.put(event)

    def _exit(self, event):
        rank = event["rank"]
        status = event.get("status")
        if status == "ok":
            payload = b"".join(self._value_parts.pop(rank, [])) + base64.b64decode(event.pop("value", ""))
            if not hmac.compare_digest(str(event.pop("sig", "")), sign(self.token, payload)):
                self.rejected += 1  # never unpickled: reported as this rank's failure
                status, event["status"] = "error", "error"
                event["summary"] = {"type": "SignatureError",
                                    "message": "the rank's value arrived with a bad signature"}
            else:
                self.outcomes[rank] = (rank, "ok", payload)
        if status != "ok":
            info = dict(event.get("summary") or {}, rank=rank, host=self.session.host_of(rank),
                        code=event.get("code"))
            self.outcomes[rank] = (rank, "stopped" if status == "stopped" else status, info)
        if len(self.outcomes) == self.session.np:
            self.ended.set()

    def announce(self, message):
        self.session.server.broadcast(message)

    def broadcast(self, message):
        self.session.server.broadcast(message)

    def stop_all(self, reason):
        """Interrupt the cell on every rank (SIGINT: a KeyboardInterrupt); the ranks stay."""
        self.session.server.broadcast({"t": "interrupt", "cell": self.cell_id, "reason": reason})

    def close(self):
        self.session.cell_ended(self)


class SessionLauncher(Launcher):
    def __init__(self, session):
        super().__init__()
        self.session = session
        self.channel = None

    @property
    def where(self):
        return f"session {self.session.id} ({self.session.where})"

    def prepare(self, np):
        self.session.check_usable()

    def use_data(self, df, np, cache=None):
        """The plan, made by the launcher the session's ranks were started with."""
        inner = self.session.launcher
        inner.use_data(df, np, cache)
        self.data, inner.data = inner.data, None

    def open_channel(self):
        self.channel = self.session.open_cell()
        return self.channel

    def start(self, settings, np):
        job = pickle.loads(settings.job)
        job["kwargs"].update(settings.broadcast_kwargs)  # `share` kept them as bytes
        job["cell"] = self.channel.cell_id
        for event in self.session.rank_states():  # who the ranks are, for this run's view
            self.channel.deliver(event)
        *before, last = parts(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        for data in before:  # a large job in parts, each frame under the channel's cap
            self.session.server.broadcast({"t": "cell_part", "cell": self.channel.cell_id, "data": data})
        self.session.server.broadcast({"t": "cell", "cell": self.channel.cell_id, "job": last})

    def done(self):
        return self.channel is not None and self.channel.ended.is_set()

    def join(self, timeout=None):
        if self.channel is not None:
            self.channel.ended.wait(timeout)
        if self.done() and self.outcomes is None:  # (after `cancel` too: who did end, and how)
            self.outcomes = sorted(self.channel.outcomes.values())

    def cancel(self):
        """The ranks did not stop after the interrupt: give up on the cell, keep the error."""
        if self.done():
            return
        stuck = sorted(set(range(self.session.np)) - set(self.channel.outcomes))
        message = (f"ranks {', '.join(map(str, stuck))} did not stop after the interrupt (a rank "
                   f"stuck in a Horovod collective cannot be interrupted); the session must be "
                   f"restarted: %horovod_session restart")
        self.session.broken = message
        self.error = LaunchError(message)
        self.channel.ended.set()
