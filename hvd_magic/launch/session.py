"""Running one cell in a warm session: a `Launcher` whose ranks are already there.

The session (`hvd_magic.driver.session.Session`) keeps N rank processes alive behind one
long-lived launch and one event server. For a cell, `SessionLauncher` sends the job to every
task over that server and gives the driver loop a `CellChannel`: the session's router puts the
events of the running cell there, so the driver loop, the views, the run folder, results and
errors work exactly as for a one-off launch.

In an elastic session a cell runs on the live ranks only; a rank lost while it runs ends the
cell with a message saying so (`lost_message`), unless the survivors finished it themselves
(inside `hvd.elastic.run`), and the session goes on without it.

A cell's end on a rank is its ``exit`` event; its value comes with it, signed by the task with
the session's token, and is checked here before it is ever unpickled.
"""

import base64
import hmac
import pickle
import queue
import threading
import time

from ..words import plural
from ..errors import LaunchError
from ..task.session import parts, sign
from ..task.stopping import STOP_GRACE_SECONDS
from .base import Launcher


class CellChannel:
    """What the driver loop needs of an event server, for one cell of a session."""

    def __init__(self, session, cell_id):
        self.session = session
        self.cell_id = cell_id
        self.events = queue.Queue()
        self.rejected = 0
        self.outcomes = {}           # rank -> (rank, status, payload)
        self.expected = set(session.live)  # the ranks this cell runs on
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
        if event.get("t") == "exit" and event.get("status") != "lost":  # (lost before the cell)
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
        if self.expected <= set(self.outcomes):
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
    error_loses_ranks = False
    orphans_heed_stop = False

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
        job["debug"] = self.session.debug  # an error holds the rank in pdb (rank/debugger.py)
        job["reset"] = self.session.reset_due  # a rank was lost: the survivors reset Horovod first
        # (host, pid) of the live ranks: for the reset, and for a survivor whose collective
        # fails during the cell to close the old ring (`hvd_magic.rank.session.release_horovod`)
        job["peers"] = self.session.survivors() if self.session.elastic is not None else []
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
            outcomes = sorted(self.channel.outcomes.values())
            self.error = self.error or lost_message(self.session, outcomes)
            # a lost rank's end is a membership change (the run's `Membership`), not a failure
            self.outcomes = [o for o in outcomes
                             if self.session.elastic is None or o[1] != "died"]

    def ring_working(self):
        """(`Membership.progressed`) Nothing to do: a session's lost ranks are not replaced."""

    def cancel(self):
        """The ranks did not stop after the interrupt: give up on the cell, keep the error."""
        if self.done() or self._survivors_may_still_end():
            return
        stuck = sorted(self.channel.expected - set(self.channel.outcomes))
        message = (f"ranks {', '.join(map(str, stuck))} did not stop after the interrupt (a rank "
                   f"stuck in a Horovod collective cannot be interrupted); the session must be "
                   f"restarted: %horovod_session restart")
        self.session.broken = message
        self.error = LaunchError(message)
        self.channel.ended.set()

    def _survivors_may_still_end(self):
        """A rank was lost during this elastic session's cell: a survivor waiting on a peer in a
        Gloo collective fails there when Horovod's Gloo timeout has passed, and then ends the
        cell (keeping its namespace). Until then the session waits for it."""
        session = self.session
        lost = [session.lost[r]["time"] for r, (_, status, _) in self.channel.outcomes.items()
                if status == "died" and r in session.lost]
        if session.elastic is None or not lost:
            return False
        env = {**session.horovod_env, **session.extra_env}
        patience = float(env.get("HOROVOD_GLOO_TIMEOUT_SECONDS", 60)) + STOP_GRACE_SECONDS + 5
        return time.time() < max(lost) + patience


def lost_message(session, outcomes):
    """The error of a cell during which an elastic session lost ranks, or None when none was
    lost or every survivor finished the cell (inside `hvd.elastic.run`, say)."""
    lost = [rank for rank, status, _ in outcomes if status == "died"]
    survivors = [status for rank, status, _ in outcomes if rank not in lost]
    if not lost or session.elastic is None or (survivors and all(s == "ok" for s in survivors)):
        return None
    how = "; ".join(f"rank {r} was lost ({session.lost.get(r, {}).get('how', 'died')})"
                    for r in lost)
    if session.broken:
        return LaunchError(f"{how} while this cell ran; {session.broken}: the session cannot go "
                           "on. %horovod_session restart starts a new one.")
    return LaunchError(f"{how} while this cell ran; the session goes on with "
                       f"{plural(len(session.live), 'rank')} (Horovod is reset on them before "
                       "the next "
                       "cell) — run the cell again. What the lost rank held is gone; code "
                       "inside hvd.elastic.run recovers by itself.")
