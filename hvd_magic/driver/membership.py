"""Who is in an elastic run's ring, and every change to it: the driver's record of it.

An elastic run (`hvd_magic.launch.elastic.launcher`) keeps going when a rank process is lost: its slot
(the view's row) gets a new process later. Each change is a dict in `changes` (also
``run.membership``), recorded in ``events.jsonl`` and told to the view as a line:

- ``lost``: a slot's process ended by a signal or without a word: its host key, pid, exit code or
  signal, its last line;
- ``joined``: a new process started for a lost slot (attempt 2, 3...); its log is
  ``rank-<k>.attempt<n>.log``, beside the earlier attempts' logs;
- ``ring``: Horovod formed a ring: its size and the slots in it, the ring's size over time, and
  which Horovod rank each slot is in it (``order``; also each `RankState.horovod_rank`). A ring
  with a slot already lost in it is recorded, never told: it never trains.

A loss that leaves no member of the last ring (every rank lost at once, none finished) took the
run's state with it: there is no commit to go on from. Unless the launcher may restart from
scratch (``--restart-from-scratch``), the run stops with an error that says what was lost
(`error`); with it, the view is told that the replacements start over from step 0.

Horovod's elastic driver's own log lines go to the run folder's ``elastic.log`` while the run
lasts (`hvd_magic.driver.horovod_log`), not under the cell.

A member alive but frozen (no CPU, not in the collective the others have waited in for
``--frozen-timeout`` seconds: `hvd_magic.driver.frozen`) is given up: `give_up_frozen` has its
task kill it, and its ``lost`` says why.

Not for: starting or replacing processes (the launcher), or drawing (views show the lines).
The hang watchdog looks only at the ranks `watched` gives: an elastic reset is not a hang.
"""

import time

from . import frozen
from .horovod_log import HorovodLog
from ..words import plural
from .ranks import RankState


class Membership:
    def __init__(self, np, min_np, max_np, timeout=None, frozen_timeout=None):
        self.np, self.min_np, self.max_np, self.timeout = np, min_np, max_np, timeout
        self.frozen_timeout = frozen_timeout or frozen.DEFAULT_TIMEOUT
        self.changes = []
        self.attempts = [1] * np     # the attempt number of each slot's current process
        self.error = None            # a LaunchError: every rank lost, and no restart allowed
        self._frozen = {}            # slot -> (attempt, how) of a process given up as frozen
        self._waited = {}            # slot -> when it was last seen waiting (monotonic)
        self._horovod_log = None

    def log_horovod(self, run_dir):
        """From before Horovod's driver starts until `end`: its log lines to ``elastic.log``."""
        self._horovod_log = HorovodLog(run_dir).start()

    def end(self):
        """The run ended (Horovod's driver with it)."""
        if self._horovod_log is not None:
            self._horovod_log.stop()
            self._horovod_log = None

    @property
    def ring_sizes(self):
        """[(time, ring size)], one per ring Horovod formed."""
        return [(c["time"], c["size"]) for c in self.changes if c["t"] == "ring"]

    def _add(self, run, change, message):
        self.changes.append(change)
        run.folder.record(change)
        if run.view is not None:
            run.view.event(run, None, dict(change, message=message))

    def lost(self, run, r, event):
        """Slot `r`'s process ended without finishing (a signal, a crash): the others go on.
        True when the run must stop: no member of its last ring is left, and the launcher may
        not restart from scratch."""
        r.state = "lost"
        summary = event.get("summary") or {}
        code = event.get("code")
        change = {"t": "lost", "rank": r.rank, "attempt": self.attempts[r.rank],
                  "log": run.folder.log_path(r.rank, readable=True),
                  "key": r.executor, "pid": r.pid, "host": r.host, "code": code,
                  "signal": summary.get("signal"), "last_line": r.last_line,
                  "time": round(time.time(), 3)}
        from ..launch.elastic.launcher import how_lost

        attempt, given_up = self._frozen.get(r.rank, (None, None))
        how = given_up if attempt == self.attempts[r.rank] else how_lost(dict(summary, code=code))
        change["how"] = how
        last = f"; its last line: {r.last_line.strip()}" if r.last_line.strip() else ""
        said = f"rank {r.rank} lost ({r.executor}, pid {r.pid}, {how}){last}."
        ring = self._last_ring()
        if ring is None or len(self._dead(run, ring)) < ring["size"]:
            self._add(run, change, f"{said} The others go on from their last commit.")
            return False
        members = self._holders_of_the_state()
        gone = [c for c in self.changes + [change]
                if c["t"] == "lost" and (c["rank"], c["attempt"]) in members]
        steps = [run.ranks[c["rank"]].step for c in gone if run.ranks[c["rank"]].step is not None]
        each = ", ".join("rank {rank}: {how}".format(**c) for c in gone)
        state = (f"every rank of the last {ring['formed']} was lost ({each}), and the training "
                 f"state they held (their last commit"
                 + (f"; step {max(steps)} was the last reported" if steps else "") + ") went with "
                 "them: no rank is left to go on from")
        if getattr(run.launcher, "restart_from_scratch", False):
            self._add(run, change, f"{said} {state[0].upper()}{state[1:]}. The replacements start "
                                   f"over from step 0 (--restart-from-scratch).")
            return False
        self._add(run, change, f"{said} {state[0].upper()}{state[1:]}: the run stops.")
        from ..errors import LaunchError
        self.error = LaunchError(
            f"the elastic run stopped: {state}. Replacements would start over from step 0, "
            f"which an elastic run does only when asked: run the cell again, or pass "
            f"--restart-from-scratch (restart_from_scratch=True) to let them. The lost "
            f"ranks' logs: {', '.join(c['log'] for c in gone)}")
        return True

    def _last_ring(self):
        return next((c for c in reversed(self.changes) if c["t"] == "ring"), None)

    def _holders_of_the_state(self):
        """(slot, attempt) of the members of the world the last one's state came from: a world
        of survivors alone (no joiner) goes on with its predecessor's."""
        rings = [set(zip(c["order"], c["attempts"])) for c in self.changes if c["t"] == "ring"]
        held = rings.pop()
        while rings and held <= rings[-1]:
            held = rings.pop()
        return held

    @staticmethod
    def _dead(run, ring):
        """The members of `ring` whose process in it was lost (a replacement's ring may be
        told before its process is)."""
        return [s for s, a in zip(ring["order"], ring["attempts"])
                if run.ranks[s].attempt > a or (run.ranks[s].attempt == a
                                                and run.ranks[s].state == "lost")]

    def joined(self, run, r, event):
        """A new process for slot `r` (its earlier one was lost): a fresh log and state."""
        self.attempts[r.rank] += 1
        attempt = self.attempts[r.rank]
        run.folder.new_attempt(r.rank, attempt)
        fresh = RankState(r.rank)
        fresh.history = r.history  # the slot's metrics go on across attempts
        fresh.horovod_rank = r.horovod_rank  # (the ring that took it in was told first)
        fresh.attempt = attempt
        vars(r).update(vars(fresh))
        change = {"t": "joined", "rank": r.rank, "attempt": attempt,
                  "key": event.get("executor"), "pid": event.get("pid"),
                  "time": round(time.time(), 3)}
        self._add(run, change, f"rank {r.rank} replaced: attempt {attempt} started "
                               f"({change['key']}, pid {change['pid']}); it joins at the next "
                               f"commit.")

    def ring(self, run, event):
        from ..launch.elastic.launcher import slot_of

        keys = [slot_of(k) for k in event.get("keys", ())]
        order = [slot for slot, _ in keys]  # Horovod's rank order
        slots = sorted(order)
        formed = event.get("formed") or "ring"  # Horovod's ring, or a torch.distributed world
        change = {"t": "ring", "size": len(slots), "slots": slots, "order": order,
                  "attempts": [attempt for _, attempt in keys],
                  "formed": formed, "time": round(float(event.get("time") or time.time()), 3)}
        if self.changes and self.changes[-1] == change:
            return False
        for r in run.ranks:
            r.horovod_rank = order.index(r.rank) if r.rank in order else None
        if self._dead(run, change):  # a member died as it formed: a
            self.changes.append(change)  # ring that never trains, and no line naming the dead
            run.folder.record(change)
            return True
        message = f"{formed} of {plural(len(slots), 'rank')}: slots {', '.join(map(str, slots))}"
        if order != list(range(len(order))):  # rows and the ranks in it differ: say how
            whose = "Horovod rank" if formed == "ring" else "rank"
            message += " (" + ", ".join(f"slot {s} is {whose} {i} in it"
                                        for i, s in enumerate(order) if s != i) + ")"
        self._add(run, change, message)
        return True

    def progressed(self, run):
        """A rank reported a step: once a ring formed, its ranks train again (the launcher may
        now offer the lost ranks' replacements: `ElasticLocalLauncher.ring_working`)."""
        if self.changes and self.changes[-1]["t"] == "ring":
            run.launcher.ring_working()

    def give_up_frozen(self, run):
        """(The driver loop, each tick) members alive but frozen while others waited for
        `frozen_timeout` seconds: each one's task told to kill it (once per process)."""
        now = time.monotonic()
        self._waited.update((r.rank, now) for r in run.ranks if r.blocked_since is not None)
        waiting, idle = frozen.frozen(self.watched(run.ranks), self.frozen_timeout,
                                      self._waited, now)
        if not waiting:
            idle = frozen.left_behind([r for r in run.ranks if r.state != "lost"],
                                      self.frozen_timeout)
        for r in idle:
            if self._frozen.get(r.rank, (None,))[0] == self.attempts[r.rank]:
                continue
            self._frozen[r.rank] = (self.attempts[r.rank], frozen.how(waiting,
                                                                      self.frozen_timeout))
            if run._server is not None:
                run._server.broadcast({"t": "frozen", "slot": r.rank, "pid": r.pid})

    def watched(self, ranks):
        """The ranks the hang watchdog compares in an elastic run: not the lost ones, nor those
        in hvd.init() (there they wait on Horovod's elastic driver for the ring to re-form,
        bounded by the elastic timeout, not on a peer that forgot a collective)."""
        return [r for r in ranks if r.state != "lost" and r.blocked_op != "init"]

    def survivors(self, results, ok_ranks):
        """The values of the slots whose last process finished, in slot order."""
        return [results[s] for s in sorted(ok_ranks)]

    def summary(self):
        """One line per change, for the text view's summary."""
        lines = []
        for c in self.changes:
            when = time.strftime("%H:%M:%S", time.localtime(c["time"]))
            if c["t"] == "lost":
                lines.append(f"  {when} rank {c['rank']} lost ({c['key']}, {c['how']})")
            elif c["t"] == "joined":
                lines.append(f"  {when} rank {c['rank']} joined (attempt {c['attempt']}, {c['key']})")
            else:
                lines.append(f"  {when} {c.get('formed', 'ring')} of {c['size']}: slots "
                             f"{', '.join(map(str, c['slots']))}")
        return "\n".join(lines)
