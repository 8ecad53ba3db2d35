"""A warm session: N rank processes that live across cells and keep their state.

`Session.start` makes one long-lived launch (a Spark barrier stage that holds its N tasks, or N
processes on the driver) whose tasks start their ranks in session mode
(`hvd_magic.rank.session`) and connect to one event server. A router thread reads that server:
events of the running cell go to its `CellChannel` (so a cell is an ordinary `Run` whose
launcher is `hvd_magic.launch.session.SessionLauncher`); the rest keeps the session's own view
of its ranks (host, pid, state) and notices a rank process that dies.

An elastic session (``min_np``: `hvd_magic.launch.elastic.session`) outlives a lost rank: the
rank's slot is marked lost, the survivors keep their processes and namespaces, and the next
cell's job tells them to reset Horovod first (``"reset"``: `hvd_magic.rank.session`), which
forms the smaller ring through Horovod's elastic driver. A lost slot is not refilled; fewer
than ``min_np`` survivors end the session.

What a rank prints while no cell's code runs (`hvd_magic.rank.session.BetweenCells`: before the
first cell, between cells, a survivor's Horovod on its lost peer) is no cell's output: it goes to
the session's log, ``hvd_runs/<session id>/rank-<k>.log``, whenever it arrives.

Ends: `stop` (or the kernel's exit, or the idle limit) stops every rank and frees the Spark
slots; a rank whose driver link drops (the notebook was killed) is stopped by its task.
"""

import datetime
import itertools
import os
import pickle
import secrets
import threading
import time

from .. import frameworks
from ..config import fresh_by_default
from ..errors import LaunchError
from .ranks import is_rank
from ..task.settings import TaskSettings

READY_TIMEOUT = 300.0


class Session:

    def __init__(self, launcher, placement, *, horovod_env, extra_env, idle_timeout=None,
                 run_root="hvd_runs", fresh=None, debug=False):
        self.id = datetime.datetime.now().strftime("s%H%M%S-") + secrets.token_hex(2)
        self.launcher = launcher
        self.placement = placement   # `hvd_magic.config.Placement`: a cell's options meet it
        self.np = placement.ranks
        self.horovod_env = horovod_env
        self.extra_env = extra_env
        self.idle_timeout = idle_timeout
        # ranks forked from the template (holding what earlier cells imported), or new interpreters
        self.fresh = fresh_by_default() if fresh is None else fresh
        self.debug = debug           # a rank whose cell raises is held in pdb (rank/debugger.py)
        self.run_root = run_root
        self.folder = os.path.abspath(os.path.join(run_root, self.id))  # the between-cells logs
        self.server = None
        self.gathering = frameworks.Gathering(self.np)  # the tasks' rendezvous values
        self.where = None
        self.ranks = {}              # rank -> its "starting"/"ready" state event (host, pid, ...)
        self.ready = set()
        self.broken = None           # why the session cannot run cells any more
        self.stopped = False
        self.started = None
        self.last_used = time.monotonic()
        self.cells = 0
        self.elastic = placement.elastic  # (min_np, max_np, timeout) of an elastic session, or None
        self.lost = {}               # slot -> how its process ended (elastic sessions)
        self.rings = []              # (time, slots) of every ring Horovod formed
        self.reset_due = False       # a rank was lost and the survivors have not reset Horovod
        # What the ranks hold, as the notebook knows it: the names cells assigned there (their
        # values win over the notebook's), and the global names each function defined there
        # reads (capture/session.py sends the notebook's current values of those).
        self.assigned = set()
        self.functions = {}
        self.exited = set()          # the ranks whose process's end was heard
        self._cell_ids = itertools.count(1)
        self._current = None
        self._lock = threading.Lock()

    # -- life -----------------------------------------------------------------------------------
    def start(self, progress=None):
        """Start the ranks and wait until every one is ready for cells."""
        self.launcher.prepare(self.np)
        self.where = self.launcher.where
        self.server = self.launcher.open_channel(sink=self)  # events come to `put`, at once
        if self.elastic is None:  # (an elastic launcher's own channel names its lost slots)
            self.server.report_drops = True  # a task gone with its executor says nothing more
        settings = TaskSettings(
            run_id=self.id, np=self.np,
            events_address=f"{self.launcher.driver_host}:{self.server.port}",
            token=self.server.token, job=pickle.dumps(None), horovod_env=self.horovod_env,
            cwd=os.getcwd(), extra_env=self.extra_env, session=True,
            executor_cores=self.launcher.executor_cores, fork=not self.fresh,
            shipment=tuple(self.launcher.shipment),
            # No Horovod timeline unless --env asks for one: its cells are not known yet, and a
            # configured timeline costs every training step (driver/run.py may_record_window).
            timeline_window=False)
        self.started = time.time()
        self.launcher.start(settings, self.np)
        deadline = time.monotonic() + READY_TIMEOUT
        while len(self.ready) < self.np and self.broken is None and not self.launcher.done():
            if time.monotonic() > deadline:
                self.broken = f"the ranks were not ready after {READY_TIMEOUT:g} s"
                break
            if progress is not None:
                progress(self)
            time.sleep(0.05)
        if len(self.ready) < self.np:
            failed = [p for _, status, p in self.launcher.outcomes or () if status == "error"]
            error = self.broken or str(self.launcher.error or (failed and failed[0].get("message"))
                                       or "the launch ended")
            self.stop()
            raise LaunchError(f"the session did not start: {error}")
        if self.idle_timeout:
            threading.Thread(target=self._watch_idle, daemon=True).start()
        return self

    def stop(self):
        """Stop every rank and end the launch (frees the Spark slots); idempotent."""
        if self.stopped:
            return
        self.stopped = True
        self.broken = self.broken or "the session was stopped"
        if self.server is not None:
            self.server.stop_all("session stopped")
        self.launcher.join(timeout=10)
        if not self.launcher.done():
            self.launcher.cancel()
            self.launcher.join(timeout=10)
        if self.server is not None:
            self.server.close()

    def _watch_idle(self):
        while not self.stopped:
            time.sleep(min(5.0, self.idle_timeout))
            if self._current is None and time.monotonic() - self.last_used > self.idle_timeout:
                self.broken = f"the session was stopped after {self.idle_timeout:g} s idle"
                self.stop()

    # -- cells ----------------------------------------------------------------------------------
    def check_usable(self):
        if self.broken is not None:
            raise LaunchError(f"session {self.id} cannot run cells: {self.broken}. Start a new "
                              f"one: %horovod_session restart")
        if self._current is not None:
            raise LaunchError(f"session {self.id} is running another cell.")

    def open_cell(self):
        from ..launch.session import CellChannel

        with self._lock:
            self._current = CellChannel(self, next(self._cell_ids))
            self.cells += 1
            return self._current

    def remember(self, cell):
        """A cell (`SessionCell`) reached the ranks: the names it assigned there, its functions."""
        self.assigned.update(cell.assigns)
        for name in cell.assigns:  # a name rebound to something else is no function of ours
            self.functions.pop(name, None)
        self.functions.update(cell.functions)

    def cell_ended(self, channel):
        with self._lock:
            if self._current is channel:
                self._current = None
        self.last_used = time.monotonic()

    @property
    def busy(self):
        """A cell runs on the ranks now."""
        return self._current is not None

    @property
    def live(self):
        """The slots whose rank process is alive (all of them unless an elastic session lost some)."""
        return [r for r in range(self.np) if r not in self.lost]

    def survivors(self):
        """(host, pid) of each live rank."""
        return [(self.ranks.get(r, {}).get("host"), self.ranks.get(r, {}).get("pid"))
                for r in self.live]

    def rank_states(self):
        """A "running" state event per live rank, an ending per lost one, with what the
        session knows of it."""
        return [dict(self.ranks.get(r, {}), t="state", state="running", rank=r)
                if r not in self.lost else
                {"t": "exit", "rank": r, "status": "lost", "code": self.lost[r]["code"],
                 "summary": {"message": "lost before this cell"}}
                for r in range(self.np)]

    def host_of(self, rank):
        return self.ranks.get(rank, {}).get("host")

    # -- events ---------------------------------------------------------------------------------
    def put(self, event):
        """An event from a task (called by the event server's connection threads): the running
        cell's go to its channel; the session keeps what it needs to know of its ranks."""
        kind, rank = event.get("t"), event.get("rank")
        if kind == "ring":  # from the elastic launcher: Horovod formed a ring
            self._ring(event)
        elif not is_rank(rank, self.np):
            return
        if kind == "dropped":  # its task's connection ended
            if self.stopped or rank in self.exited:
                return
            event, kind = task_lost(rank, self.ranks.get(rank, {})), "exit"
        if kind == "lines" and event.get("between_cells"):  # no cell's, whichever runs now
            self._between_cells(rank, event.get("lines") or [])
            return
        if kind == "rendezvous":  # the frameworks' rendezvous: every task's, to all
            relayed = self.gathering.add(rank, event)
            if relayed is not None:
                self.server.announce({"t": "rendezvous", "relay": relayed})
        elif kind == "state" and event.get("state") in ("starting", "ready"):
            self.ranks[rank] = {**self.ranks.get(rank, {}),
                                **{k: v for k, v in event.items() if k not in ("t", "state")}}
            if event["state"] == "ready":
                self.ready.add(rank)
            return
        elif kind == "exit" and "cell" not in event and not self.stopped:
            # the rank process itself ended: killed, crashed, out of memory
            self.exited.add(rank)
            summary = event.get("summary") or {}
            how = ("out of memory" if summary.get("oom") else None) or summary.get('signal') \
                or summary.get('type') or event.get('status')
            if self.elastic is not None and event.get("status") == "died":
                self._lost(rank, event, how)
            else:
                self.broken = f"rank {rank} on {self.host_of(rank)} ended ({how})"
        current = self._current
        if current is not None:
            current.deliver(event)

    def log_path(self, rank):
        """What rank `rank` printed while no cell ran."""
        return os.path.join(self.folder, f"rank-{rank}.log")

    def _between_cells(self, rank, lines):
        os.makedirs(self.folder, exist_ok=True)
        with open(self.log_path(rank), "a", encoding="utf-8", errors="replace") as log:
            log.write("".join(f"{line}\n" for line in lines))

    def _lost(self, rank, event, how):
        self.lost[rank] = {"code": event.get("code"), "how": how, "time": time.time(),
                           "host": self.host_of(rank), "pid": self.ranks.get(rank, {}).get("pid")}
        self.reset_due = True
        if len(self.live) < self.elastic[0]:
            left = len(self.live)
            self.broken = (f"rank {rank} was lost ({how}) and {left} rank{'s' * (left != 1)} "
                           f"{'are' if left != 1 else 'is'} left, fewer than --min-np "
                           f"{self.elastic[0]}")

    def _ring(self, event):
        from ..launch.elastic.launcher import slot_of

        slots = sorted(slot_of(key)[0] for key in event.get("keys", ()))
        self.rings.append((float(event.get("time") or time.time()), slots))
        if not set(slots) & set(self.lost):  # the survivors have reset Horovod
            self.reset_due = False


def task_lost(rank, known):
    """The end of rank `rank` (`known`: its host and executor) whose task ended without a word:
    its executor was lost (a worker gone, a host cut off) or Spark killed the task (its barrier
    stage failed)."""
    host = known.get("host") or "?"
    return {"t": "exit", "rank": rank, "code": None, "status": "died",
            "summary": {"type": "TaskLost", "host": host, "message":
                        f"its task on {host} (executor {known.get('executor')}) ended without a "
                        f"word: its executor was lost, or Spark killed the task"}}
