"""Elastic torch.distributed runs (``--min-np`` on code that uses `hvd_magic.elastic`, not
Horovod): the membership is ours, kept here in the notebook; no Horovod anywhere.

The slots, their workers and how a loss is heard are the elastic launchers' own
(`hvd_magic.launch.elastic.launcher`, and on Spark a plain task per slot: `spark`); what Horovod's
elastic driver decides there, `TorchMembership._drive` decides here:

- each slot's worker is one rank process, started with the run's torch variables but no rank: it
  says ``join`` (`hvd_magic.rank.elastic_world`) and waits;
- a world (a generation `g`) is the slots that train together, in rank order. The first forms
  once the ``np`` first workers joined (or the ``min_np`` or more that had room after
  `START_GRACE` seconds; a worker that started is waited for up to `JOIN_WAIT`). It is told to
  them as ``reform``; its rank 0 makes the store and says where (``store``), which is told to
  all as ``world``; each then makes its process group;
- a worker that dies is a loss: every worker is told ``lost`` at once (the sockets its group
  made are cut, so no collective waits on the dead peer; the code's own stay open), and the survivors get a new world
  without it, made on a new store (as are the same members when one says it could not make its
  world's group: ``failed``, its store or a peer gone meanwhile). The lost slot gets a new
  worker (a new attempt) where it has room, which joins the world at the others' next commit (a
  ``reform`` they act on in ``state.commit()``), as does a slot beyond ``np`` (up to ``max_np``)
  that gets room later;
- every member lost at once (none left, none finished): their state went with them; new
  workers start over from step 0 only with ``--restart-from-scratch``, else no new worker
  starts and the run ends with the driver's error (`hvd_magic.driver.membership`);
- fewer than ``min_np`` left: the survivors wait for replacements for the elastic timeout, then
  the run ends with the launcher's error (`launcher.too_few_message`);
- a worker that raised, or a stop (a Cancel, the timeout), ends the run as in every run.

Each world is told to the driver loop as a ``ring`` event (`hvd_magic.driver.membership`), as
Horovod's rings are.
"""

import queue
import threading
import time
import types

from ...rank.elastic_world import ADDRESS, ELASTIC, SLOT, WAIT
from .launcher import SLOT_KEY, ElasticLauncher, ElasticLocalLauncher, how_lost
from .spark import ElasticSparkLauncher, _SlotEvents

START_GRACE = 10.0       # seconds the first world waits for room for all `np` workers
JOIN_WAIT = 60.0         # ... and for a started worker to join (a slow start: imports)
DEFAULT_TIMEOUT = 600.0  # the elastic timeout, as Horovod's default (HOROVOD_ELASTIC_TIMEOUT)


class TorchMembership:
    """Our own membership driver, in place of Horovod's, for an `ElasticLauncher`."""

    formed = "world"  # (torch.distributed's: no Horovod ring here)
    restart_from_scratch = False  # every member lost: new workers from step 0 (make_launcher)

    def start(self, settings, np):
        self._lock = threading.RLock()  # (the launcher's own methods take it too)
        self._changed = threading.Condition(self._lock)
        self._settings = settings
        self._rows = np           # the slots (the view's rows)
        self._world, self._g = [], -1
        self._again = False       # a member said it could not make the current world's group
        self._joined = set()      # slots whose current worker waits to be in a world
        self._running = {}        # slot -> its worker's stop event
        self._attempts = {}       # slot -> its latest attempt
        self._finished = getattr(self, "_finished", set())
        self._began = time.monotonic()
        self._short_since = None  # fewer than min_np since when
        super().start(settings, np)

    def _drive(self, settings, np):
        initial = self._initial_np(np)
        with self._changed:
            while True:
                self._start_workers(initial)
                if not self._running and (self._stopping or self._world or self._ended_all()):
                    break
                self._decide(initial)
                self._changed.wait(0.2)
        outcomes = self._final_outcomes()
        if self.error is None and not self._stopping_by_run():
            self.error = self._ending_error(outcomes)
        self.outcomes = outcomes

    def _stopping_by_run(self):
        return self._stopping and self._gave_up is None

    def _ended_all(self):
        """No worker runs and none can start again."""
        return all(self._attempts.get(s, 0) > self._replacements() or s in self._finished
                   for s in range(self._rows))

    # -- workers --------------------------------------------------------------------------------
    def _start_workers(self, initial):
        """A worker in every slot that has room and none (the first `initial` slots at the
        start; a lost slot again; a slot beyond them when it gets room)."""
        if self._stopping or (self._world and self._done_training()):
            return
        if self._world and not self.restart_from_scratch and not self._world_alive():
            # every member was lost, and the state with them: no replacement starts over from
            # step 0 unasked, and one that started to join them ends (the driver's
            # `Membership.lost` says what was lost)
            self._stop_workers()
            return
        if self._g < 0 and time.monotonic() - self._began < START_GRACE and not all(
                s in self._running or self._has_capacity(s) for s in range(initial)):
            return  # (all of the first at once: each counts the others on its host, threads.py)
        for slot in range(self._rows if self._g >= 0 else initial):
            attempt = self._attempts.get(slot, 0) + 1
            if slot in self._running or slot in self._finished or \
                    attempt > self._replacements() + 1 or not self._has_capacity(slot):
                continue
            self._attempts[slot] = attempt
            stop = self._running[slot] = threading.Event()
            key = self._keys[slot] = SLOT_KEY.format(slot=slot, attempt=attempt)
            self._in_background(self._worker, f"hvd-magic-slot-{slot}", slot, attempt, key, stop)

    def _worker_env(self, slot):
        return {ELASTIC: "torch", SLOT: slot, "LOCAL_RANK": self._local_rank(slot),
                "LOCAL_WORLD_SIZE": self.max_np, "GROUP_WORLD_SIZE": 1,
                "ROLE_NAME": "default", "TORCHELASTIC_RUN_ID": self._settings.run_id,
                "TORCHELASTIC_MAX_RESTARTS": 0, "TORCHELASTIC_USE_AGENT_STORE": "False",
                WAIT: self.elastic_timeout or DEFAULT_TIMEOUT}  # (its waits' bound, and more)

    def _local_rank(self, slot):
        return slot

    def _worker(self, slot, attempt, key, stop):
        outcome = self._run_slot(slot, attempt, types.SimpleNamespace(hostname=key),
                                 self._worker_env(slot), [stop])
        status = outcome[1]
        with self._changed:
            self._running.pop(slot, None)
            self._joined.discard(slot)
            self._last[slot] = outcome
            if status == "died" and not self._stopping:
                self._dead.add(key)
                self._lost.append((slot, key, how_lost(outcome[2]), time.time()))
                self._tell({"t": "lost", "slot_lost": slot})
            elif status in ("ok", "error"):
                self._finished.add(slot)
            if status == "error" or (status == "stopped" and not stop.is_set()):
                self._stopping = True  # a rank raised, or the run was stopped: no more worlds
            self._changed.notify_all()

    # -- worlds ---------------------------------------------------------------------------------
    def _decide(self, initial):
        if self._stopping:
            return
        if self._g < 0:  # the first world: every worker started, once `initial` started
            waited = time.monotonic() - self._began
            started = self._joined == set(self._running) or waited > JOIN_WAIT
            if len(self._joined) >= self.min_np and started and (
                    len(self._joined) >= initial or waited > START_GRACE):
                self._form(sorted(self._joined))
            else:
                self._wait_for_enough(waited)
            return
        # each slot's worker now (one that finished is still its world's member)
        current = {slot: self._keys[slot] for slot in set(self._running) | self._finished}
        members = [s for s in self._world if current.get(s) == self._world_keys[s]]
        newcomers = sorted(s for s in self._joined if s not in members)
        if self._done_training():
            for slot in newcomers:
                self._running[slot].set()  # a joiner the others no longer need
            return
        if len(members) + len(newcomers) < self.min_np:
            self._short_since = self._short_since or time.monotonic()
            self._wait_for_enough(time.monotonic() - self._short_since)
            return
        self._short_since = None
        if members != self._world or newcomers or self._again:
            self._form(members + newcomers[:self.max_np - len(members)])

    def _world_alive(self):
        """A member of the world still runs (or finished) as the process that joined it."""
        return any(self._keys.get(s) == self._world_keys[s] and
                   (s in self._running or s in self._finished) for s in self._world)

    def _done_training(self):
        """Every member of the world finished (the others have nothing to join)."""
        return bool(self._world) and all(
            s in self._finished and self._keys[s] == self._world_keys[s] for s in self._world)

    def _wait_for_enough(self, waited):
        timeout = self.elastic_timeout or DEFAULT_TIMEOUT
        if waited > timeout:
            self._gave_up = (waited, timeout)
            self._stop_workers()

    def _form(self, slots):
        self._g += 1
        self._world, self._again = slots, False
        self._world_keys = {slot: self._keys[slot] for slot in slots}
        self._tell({"t": "reform", "g": self._g, "slots": slots})
        self._ring_formed([self._keys[s] for s in slots])

    def _heard(self, event):
        """A worker's ``elastic`` event (on the event server's thread)."""
        slot, what = event.get("rank"), event.get("what")
        with self._changed:
            if what == "join" and slot in self._running:
                self._joined.add(slot)
                self._changed.notify_all()
            elif what == "store" and event.get("g") == self._g:
                self._tell({"t": "world", "g": self._g, "addr": event.get("addr"),
                            "port": event.get("port")})
            elif what == "failed" and event.get("g") == self._g:  # a member could not make it
                self._again = True
                self._changed.notify_all()

    def _tell(self, message):
        if self._server is not None:
            self._server.broadcast(message)

    def _stop_workers(self):
        self._stopping = True
        for stop in self._running.values():
            stop.set()

    def _stop_elastic(self):
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def ring_working(self):
        pass


class _Heard(queue.Queue):
    """The run's event queue (or, for a warm session, its `sink`), the workers' ``elastic``
    events taken out for the launcher."""

    def __init__(self, launcher, sink=None):
        super().__init__()
        self.launcher, self.sink = launcher, sink

    def put(self, event, block=True, timeout=None):
        if event.get("t") == "elastic":
            return self.launcher._heard(event)
        if self.sink is not None:
            return self.sink.put(event)
        return super().put(event, block, timeout)


class _HeardSlots(_SlotEvents):
    def put(self, event, block=True, timeout=None):
        if event.get("t") == "elastic":
            return self.launcher._heard(event)
        return super().put(event, block, timeout)


class ElasticTorchLocalLauncher(TorchMembership, ElasticLocalLauncher):
    """``--np -N --min-np M``: N rank processes on this machine, our membership."""

    def open_channel(self, sink=None):
        return ElasticLauncher.open_channel(self, _Heard(self, sink))

    def _worker_env(self, slot):
        return dict(super()._worker_env(slot), **{ADDRESS: "127.0.0.1",
                                                  "GLOO_SOCKET_IFNAME": _loopback()})


class ElasticTorchSparkLauncher(TorchMembership, ElasticSparkLauncher):
    """``--np N --min-np M``: a Spark task per slot, our membership."""

    def open_channel(self, sink=None):
        from ...event_server import EventServer

        self._events = _HeardSlots(self, sink)
        self._server = EventServer(host=self.bind_host, sink=self._events, report_drops=True)
        return self._server

    def _has_capacity(self, slot):
        """The slot's task is there and free (it offered the slot again once its last worker
        ended: until then it cannot take an order)."""
        task = self._slots.get(slot)
        return task is not None and task.key is None

    def _local_rank(self, slot):
        task = self._slots.get(slot)
        if task is None:
            return 0
        return sorted(s for s, t in self._slots.items() if t.machine == task.machine).index(slot)

    def _slot_ready(self, event):
        super()._slot_ready(event)
        with self._changed:
            self._changed.notify_all()

    def _stop_workers(self):
        super()._stop_workers()
        self._server.announce({"t": "slots_done"})


class _Survivors:
    """A warm session's: a lost slot gets no new process (it would start with an empty
    namespace); the session goes on with the survivors, in a smaller world."""

    def _start_workers(self, initial):
        if self._g < 0:
            super()._start_workers(initial)


class ElasticTorchSessionLauncher(_Survivors, ElasticTorchLocalLauncher):
    """An elastic torch.distributed session, ``--np -N --min-np M``."""


class ElasticTorchSparkSessionLauncher(_Survivors, ElasticTorchSparkLauncher):
    """An elastic torch.distributed session on Spark, ``--np N --min-np M``."""


def _loopback():
    from ...frameworks.base import iface_towards
    return iface_towards("127.0.0.1")


