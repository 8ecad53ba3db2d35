"""Elastic launches (``--min-np M``): Horovod's own elastic driver in the notebook, our rank
processes as its workers. `ElasticLauncher` is what every elastic launch shares; here too is the
driver-only one (``--np -N --min-np M``, `ElasticLocalLauncher`); on Spark it is
`hvd_magic.launch.elastic.spark`.

Horovod's pieces are used as they are (`ElasticDriver`, its rendezvous handler, `HostDiscovery`,
`create_run_env_vars` / `create_slot_env_vars`); `horovod.runner.gloo_run.launch_gloo_elastic`
itself is not, because it installs SIGINT/SIGTERM handlers (the kernel's own) and starts workers
as shell commands. What is ours:

- **one host key per worker slot, fresh for every replacement** (``hvd-s1-a2``: slot 1, attempt
  2). Horovod blacklists the host of a failed worker for good; with a key per slot that costs one
  key, not the capacity. A lost slot's new key is offered by discovery once the survivors train
  again in a ring without it (the replacement then joins at a later commit), or at once when fewer
  than `min_np` are left. Not sooner: Horovod tells only rank 0 of new hosts, and a rank that is
  still re-initialising drops what it was told (`State.on_reset` empties its queue), so a key
  offered during the survivors' reset would not be acted on. "Train again" is the driver loop's
  word (`ring_working`: a step reported after the ring formed), or `REPLACE_AFTER` seconds. A step
  can reach the driver late (a rank sends its last report from a timer), so the word can come too
  soon: a key offered for `REMIND_AFTER` seconds that Horovod started no worker on is told to rank
  0 again (`_remind_rank_0`), until a worker starts; the same holds for a Spark slot that gets
  capacity mid-run;
- **a worker is our rank process** (`_run_slot`: here `hvd_magic.task.runner.run_worker`, on Spark
  a task holding the slot), so its output, progress, logs and result reach the driver loop as in
  every other run, labelled by its slot: the view's row `k` is slot `k`, whatever Horovod rank it
  has now; a slot is offered to Horovod only while it has capacity (`_has_capacity`);
- every ring Horovod forms is told to the driver loop as a ``ring`` event (`Membership`), and
  its ranks are told their local and cross ranks by the machine each key runs on (`_machine_of`;
  `hvd_magic.launch.elastic.hosts`), not one machine per key.

A worker killed by a signal is a lost member, not a failed run; one that raised is the run's error
as usual (a bug in the cell does not go away by retrying it): the driver loop shows its traceback
(`hvd_magic.driver.ending`), whether one rank raised or all of them, and Horovod's driver, which
counts both as failed workers and stops when every worker failed, is no cause for an error of
ours. The launcher's own error (`error`) names only what the ranks cannot tell: fewer than
`min_np` ranks were left for the elastic timeout (Horovod's driver gave up waiting: how long it
waited, and which ranks were lost), or every rank was lost.
"""

import logging
import threading
import time
import types

from ...compat import horovod as horovod_compat
from ...errors import LaunchError
from ...frameworks.base import iface_towards
from ...task.runner import run_worker
from ..base import Launcher
from .horovod import discovery, elastic_driver, ring_rendezvous
from .hosts import machine_rendezvous, slot_env

SLOT_KEY = "hvd-s{slot}-a{attempt}"
REPLACE_AFTER = 5.0   # seconds after a ring without the lost keys formed, if no step is heard
REMIND_AFTER = 3.0    # seconds a key may be offered with no worker started on it before rank 0
                      # is told of it again
# A slot whose processes died this many times more is not replaced again (a crash loop): the
# run goes on with the others, or ends after the elastic timeout if they are too few.
REPLACEMENTS_PER_SLOT = 3
STOP_HOROVOD_AFTER = 15.0  # seconds after our stop before Horovod's driver is stopped outright


def slot_of(key):
    """(slot, attempt) of a host key made from SLOT_KEY."""
    _, slot, attempt = key.split("-")
    return int(slot[1:]), int(attempt[1:])


class ElasticLauncher(Launcher):
    """Horovod's elastic driver over slots; a subclass runs a slot's worker (`_run_slot`) and
    says where a slot has capacity (`_has_capacity`)."""

    rendezvous_host = "127.0.0.1"  # where the workers reach Horovod's rendezvous server
    formed = "ring"  # what its ranks form, in the run's words (Horovod's ring)

    def __init__(self, min_np, max_np, elastic_timeout=None, **launcher):
        super().__init__(**launcher)
        self.min_np, self.max_np, self.elastic_timeout = min_np, max_np, elastic_timeout
        self._lock = threading.Lock()
        self._keys = {}          # slot -> its current host key
        self._dead = set()       # keys of workers that died (blacklisted: never offered again)
        self._waiting = set()    # slots whose worker died and that have no new key yet
        self._lost = []          # (slot, key, code, when) of every death
        self._last = {}          # slot -> the outcome of its latest worker
        self._started = set()    # keys Horovod started a worker on
        self._offered_since = {}  # key offered, no worker started on it yet -> since when
        self._reminded_at = float("-inf")
        self._stopping = False
        self._waiting_since = None  # Horovod's driver waits for min_np slots since when
        self._gave_up = None     # (seconds waited, elastic timeout) when Horovod's driver gave
                                 # up waiting for min_np slots
        self._rings = 0          # rings Horovod formed
        self._ring_at = None     # when a ring without the dead keys formed (replacements due)
        self._working = False    # a step was reported in that ring
        self._driver = None
        self._drive_thread = None
        self._server = None
        self._placed = {}        # key -> its SlotInfo in the current ring, by machine

    def open_channel(self, sink=None):
        self._server = super().open_channel(sink)
        return self._server

    def start(self, settings, np):
        self._keys = {slot: SLOT_KEY.format(slot=slot, attempt=1) for slot in range(np)}
        self._drive_thread = self._in_background(self._drive, "hvd-magic-elastic", settings, np)

    def _has_capacity(self, slot):
        """A worker may run in `slot` now (a Spark task holds it; on the driver, always)."""
        return True

    def _replacements(self):  # (read when asked: tests lower it)
        return REPLACEMENTS_PER_SLOT

    def _machine_of(self, key):
        """The machine the worker of host key `key` runs on (on the driver: this one)."""
        return "driver"

    def _run_slot(self, slot, attempt, slot_info, env, events):
        """Run slot `slot`'s worker to its end with Horovod's `env`; end it early when one of
        Horovod's `events` is set. Its outcome ``(slot, status, payload)``."""
        raise NotImplementedError

    # -- discovery ----------------------------------------------------------------------------
    def _offered(self):
        with self._lock:
            live = [k for k in self._keys.values() if k not in self._dead]
            due = self._ring_at is not None and (
                self._working or time.monotonic() - self._ring_at > REPLACE_AFTER)
            if self._waiting and (due or len(live) < self.min_np):
                self._replace_waiting()
            hosts = {key: 1 for slot, key in self._keys.items() if self._has_capacity(slot)}
            remind = self._remind_due(hosts)
            hosts.update({key: 1 for key in self._dead})  # kept: a vanished host is a "removal"
        if remind:
            self._remind_rank_0()
        return hosts

    def _remind_due(self, hosts):
        """Some key of `hosts` has been offered for REMIND_AFTER seconds (and none reminded of
        for as long) without a worker started on it."""
        now = time.monotonic()
        unstarted = [k for k in hosts if k not in self._started]
        self._offered_since = {k: self._offered_since.get(k, now) for k in unstarted}
        if not unstarted or self._driver is None:
            return False
        if now - max(min(self._offered_since.values()), self._reminded_at) < REMIND_AFTER:
            return False
        self._reminded_at = now
        return True

    def _remind_rank_0(self):
        """Tell Horovod's rank 0 again that hosts were added (it resets at its next commit and
        Horovod starts workers on them). Horovod tells it only when discovery sees a change, and
        a rank 0 that was re-initialising then dropped it; Horovod skips this when no worker
        would be added. (A private method of Horovod's driver: `hvd_magic.compat.horovod`.)"""
        try:
            horovod_compat.remind_hosts_added(self._driver)
        except Exception:  # (rank 0 is going away): the next reminder, or none is needed
            logging.debug("hvd_magic: reminding rank 0 of new hosts failed", exc_info=True)

    def _replace_waiting(self):
        if self._stopping:
            return
        for slot in sorted(self._waiting):
            _, attempt = slot_of(self._keys[slot])
            if attempt <= REPLACEMENTS_PER_SLOT:
                self._keys[slot] = SLOT_KEY.format(slot=slot, attempt=attempt + 1)
        self._waiting.clear()
        self._ring_at = None

    def _ring_formed(self, keys):
        with self._lock:
            self._rings += 1
            if self._waiting and not self._dead & set(keys):
                self._ring_at, self._working = time.monotonic(), False
        if self._server is not None:
            self._server.events.put({"t": "ring", "keys": list(keys), "time": time.time(),
                                     "formed": self.formed})

    def ring_working(self):
        """The driver loop heard a step from a rank since the last ring formed: the survivors
        train again, and a replacement's key may be offered."""
        self._working = True

    # -- the run ------------------------------------------------------------------------------
    def _drive(self, settings, np):
        from horovod.runner.gloo_run import create_run_env_vars

        rendezvous = ring_rendezvous(self)
        driver = None
        try:
            driver = self._driver = elastic_driver(
                self, rendezvous, discovery(self), self.min_np, self.max_np,
                timeout=self.elastic_timeout)
            port = rendezvous.start(machine_rendezvous(driver, lambda: self._placed))
            self._run_env = create_run_env_vars(
                self.rendezvous_host, [iface_towards(self.rendezvous_host)], port,
                elastic=True)
            self._settings = settings
            driver.start(self._initial_np(np), self._create_worker)
            driver.get_results()
        except BaseException as exc:  # reported by the driver loop
            if self.error is None and self._gave_up is None:
                self.error = LaunchError(f"Horovod's elastic driver failed: {exc}")
        finally:
            if driver is not None:
                driver.stop()
                driver.get_results()  # every worker thread has ended
        outcomes = self._final_outcomes()
        if self.error is None and not self._stopping:
            self.error = self._ending_error(outcomes)
        self.outcomes = outcomes

    def _ending_error(self, outcomes):
        """The launcher's error when Horovod's driver ended the run: fewer than `min_np` ranks
        for the elastic timeout, or every rank lost; None when ranks finished or raised (their
        own errors are the run's: the driver loop's `run.failures`)."""
        if self._gave_up is not None and (self._lost or not self._rings):
            # (with none lost, only ranks that raised can have left too few: theirs is the error)
            return LaunchError(too_few_message(self.min_np, self._gave_up, self._rings,
                                               self._lost))
        if outcomes or not self._lost:
            return None
        return LaunchError(f"the elastic run ended: every rank it had was lost "
                           f"({lost_text(self._lost)}), and none was left to go on from (an "
                           f"elastic run goes on from its survivors' last commit). "
                           f"{replaced_text()}")

    def _gave_up_waiting(self, waited, timeout):
        """(Horovod's driver) fewer than `min_np` slots for `timeout` seconds: it stops."""
        with self._lock:
            self._gave_up = (waited, timeout)

    def _initial_np(self, np):
        return np

    def _final_outcomes(self):
        """The outcome of each slot whose last worker finished or raised."""
        with self._lock:
            return [o for o in self._last.values() if o[1] in ("ok", "error")]

    def _create_worker(self, slot_info, events):
        """Horovod's `create_worker_fn`: run one worker to its end; (exit code, time)."""
        slot, attempt = slot_of(slot_info.hostname)
        with self._lock:
            self._started.add(slot_info.hostname)
        if self._stopping:
            return 1, time.time()
        from horovod.runner.gloo_run import create_slot_env_vars

        env = dict(self._run_env, **create_slot_env_vars(slot_info))
        placed = self._placed.get(slot_info.hostname)
        if placed is not None:  # this machine's local rank, not the key's
            env.update(slot_env(placed))
        outcome = self._run_slot(slot, attempt, slot_info, env, events)
        if outcome[1] == "stopped" and not any(e.is_set() for e in events):
            self._stop_elastic()  # our driver stopped it (cancel, timeout): no replacement
        with self._lock:
            self._last[slot] = outcome
            lost = outcome[1] == "died" and not self._stopping
            if lost:
                self._dead.add(slot_info.hostname)
                self._waiting.add(slot)
                self._lost.append((slot, slot_info.hostname, how_lost(outcome[2]), time.time()))
        if lost and self._server is not None:  # survivors cut their rings': rank/horovod_ring.py
            self._server.broadcast({"t": "lost", "slot_lost": slot})
        return (0 if outcome[1] == "ok" else 1), time.time()

    def _stop_elastic(self):
        """Our driver stops the run: no more replacements. Horovod's driver ends by itself once
        every stopped worker has recorded its failure; stopping it sooner would strand those
        already waiting in its registry's barrier (a finished driver ignores the others)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        threading.Thread(target=self._stop_horovod_later, daemon=True).start()

    def _stop_horovod_later(self):
        """The last resort, if Horovod's driver did not end by itself: stop it, and break its
        registry's barrier (a private attribute) so that no thread of it waits forever. At once
        when it waits for `min_np` slots (a rank that raised left too few): the stopped run will
        offer none, and it would wait the whole elastic timeout."""
        deadline = time.monotonic() + STOP_HOROVOD_AFTER
        while self._drive_thread.is_alive() and time.monotonic() < deadline:
            if self._waiting_since is not None:
                break
            self._drive_thread.join(0.1)
        driver = self._driver
        if driver is None or not self._drive_thread.is_alive():
            return
        driver.stop()
        horovod_compat.break_worker_barrier(driver)

    def cancel(self):
        self._stop_elastic()


class ElasticLocalLauncher(ElasticLauncher):
    """N rank processes on this machine under Horovod's elastic driver."""

    where = "driver only"

    def _run_slot(self, slot, attempt, slot_info, env, events):
        done = threading.Event()
        try:
            return run_worker(
                self._settings,
                types.SimpleNamespace(rank=slot, local_rank=local_rank(env)), env,
                executor=slot_info.hostname, partition=attempt, ranks_on_host=self.max_np,
                on_link=lambda link: threading.Thread(
                    target=self._watch, args=(link, events, done), daemon=True).start())
        except Exception as exc:  # (the driver went away): Horovod must still hear an exit
            return (slot, "died", {"rank": slot, "code": None, "message": str(exc)})
        finally:
            done.set()

    def _watch(self, link, events, done):
        """End the worker when Horovod's driver says so; end the elastic run when ours does."""
        while not done.wait(0.1):
            if link.stopping.is_set() and not link.closing:  # (not the worker's own end)
                self._stop_elastic()
                return
            if any(e.is_set() for e in events):
                link.stop_rank()
                return


def too_few_message(min_np, gave_up, rings, lost):
    """Why an elastic run ended with fewer than `min_np` ranks: `gave_up` (seconds waited, the
    elastic timeout), whether any ring formed (`rings`), the ranks `lost`."""
    waited, timeout = gave_up
    if not rings:  # (on Spark: slots that never got a task)
        return (f"the elastic run could not start: fewer than --min-np {min_np} ranks "
                f"had a place to run after {waited:.0f} s (the elastic timeout is "
                f"{timeout:g} s).")
    return (f"the elastic run ended: fewer than --min-np {min_np} ranks were left for "
            f"{waited:.0f} s, the elastic timeout ({timeout:g} s). Lost: "
            f"{lost_text(lost)}. {replaced_text()}")


def lost_text(lost):
    """The ranks lost, ``[(slot, key, how, when)]``, in one line."""
    return "; ".join(
        f"rank {slot} ({key}) {how} at {time.strftime('%H:%M:%S', time.localtime(when))}"
        for slot, key, how, when in lost)


def replaced_text():
    return (f"A rank is replaced at most {REPLACEMENTS_PER_SLOT} times; every attempt's log "
            f"is in the run folder.")


def local_rank(env):
    """A worker's local rank: Horovod's variable in its runs, torch's in ours (ddp.py)."""
    return int(env.get("HOROVOD_LOCAL_RANK", env.get("LOCAL_RANK", 0)))


def how_lost(summary):
    """How a worker was lost, in words: its signal, its exit code, or what was heard of it."""
    import signal
    code = summary.get("code")
    if isinstance(code, int) and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code is None:
        return summary.get("message") or "ended without a word"
    return f"exit code {code}"
