"""Asking every rank of a running run for its Python stack: ``Run.stacks()``.

The request goes over the run's own authenticated channel (a ``stacks`` message to every task;
`hvd_magic.task.stacks` asks its rank), the answers come back as ``stacks`` events, which the
driver loop hands to `StackRequests.stack_answer`. Whoever asks waits at most `TIMEOUT` seconds:
a rank that has not answered by then is named in the result's ``missing``, not waited on. Asked
from the driver loop's own thread (the watchdog, a timeout), the wait pumps the loop's events.

`StackRequests` is mixed into `Run`; it also keeps the stacks of a run stopped while its ranks
ran (cancelled, timed out, stalled) in the run folder's ``stacks.txt``.
"""

import itertools
import os
import threading
import time

from .stack_groups import Stacks

TIMEOUT = 2.0
_ids = itertools.count(1)
_lock = threading.Lock()


class StackRequest:
    """One request to every live rank; complete when all answered or its deadline passed."""

    def __init__(self, run, timeout):
        self.id = f"{run.id}-{next(_ids)}"
        self.run_id = run.id
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.missing = {}
        for r in run.ranks:
            if r.exit is not None:
                self.missing[r.rank] = "ended"
            elif r.pid is None:
                self.missing[r.rank] = "not started"
        self.waiting = {r.rank for r in run.ranks} - set(self.missing)
        self.threads, self.how, self.errors = {}, {}, {}
        self.collectives = {}  # rank -> where it is in its groups' collectives (rank/stacks.py)
        self.answered = threading.Condition(_lock)

    def add(self, rank, event):
        with self.answered:
            if rank not in self.waiting:
                return
            self.waiting.discard(rank)
            if isinstance(event.get("collectives"), list) and event["collectives"]:
                self.collectives[rank] = event["collectives"]
            if event.get("threads"):
                self.threads[rank] = event["threads"]
                self.how[rank] = event.get("how")
            else:
                self.errors[rank] = str(event.get("error") or "no frames")
            self.answered.notify_all()

    def complete(self):
        return not self.waiting or time.monotonic() >= self.deadline

    def result(self):
        with self.answered:
            missing = {**self.missing, **self.errors}  # (int keys: not dict(..., **errors))
            missing.update({r: f"no answer within {self.deadline - self.started:.1f} s"
                            for r in self.waiting})
            return Stacks(self.run_id, dict(self.threads), missing, dict(self.how),
                          time.monotonic() - self.started, dict(self.collectives))


class StackRequests:
    """`Run.stacks()` and what it needs (mixed into `Run`)."""

    last_stacks = None   # the last `Stacks` taken of this run

    def stacks(self, timeout=TIMEOUT):
        """Every rank's Python stack now (all threads), as a `Stacks` mapping rank -> text,
        shown grouped. A rank that cannot answer within `timeout` seconds is named in its
        ``missing``. Once the run has ended: the stacks kept when it stopped, if any."""
        if self.state not in ("running",) or self._server is None:
            if self.last_stacks is not None:
                return self.last_stacks
            raise RuntimeError(f"run {self.id} is {self.state}: there are no ranks to ask "
                               f"(and no stacks were kept when it stopped)")
        request = self.ask_stacks(timeout)
        self.wait_stacks(request)
        return request.result()

    def ask_stacks(self, timeout=TIMEOUT):
        """Send a request to every task; the `StackRequest` the answers go to."""
        request = StackRequest(self, timeout)
        with _lock:
            self._pending_stacks()[request.id] = request
        if request.waiting:
            self._server.broadcast({"t": "stacks", "id": request.id})
        return request

    def wait_stacks(self, request):
        """Until `request` is complete; in the driver loop's thread, pumping its events."""
        driver = self._driver
        in_loop = getattr(driver, "thread", None) == threading.get_ident()
        try:
            while not request.complete():
                if in_loop:
                    driver._pump(0.02)  # (the answers come through its events)
                else:
                    with request.answered:
                        request.answered.wait(min(0.05, max(0.0, request.deadline - time.monotonic())))
        finally:
            with _lock:
                self._pending_stacks().pop(request.id, None)
        self.last_stacks = request.result()
        return self.last_stacks

    def stack_answer(self, rank, event):
        """A ``stacks`` event (the driver loop's thread)."""
        with _lock:
            request = self._pending_stacks().get(str(event.get("id")))
        if request is not None:
            request.add(rank, event)

    def _pending_stacks(self):
        """Request id -> `StackRequest` waiting for answers (made on first use: `Run.__init__`
        is left as it is)."""
        return self.__dict__.setdefault("_stack_requests", {})

    def keep_stacks(self, stacks=None):
        """Write the stacks (taken now, unless given) to the run folder's ``stacks.txt``."""
        if stacks is None:
            if not self.unended():
                return None
            stacks = self.wait_stacks(self.ask_stacks())
        self.last_stacks = stacks
        with open(os.path.join(self.run_dir, "stacks.txt"), "w", encoding="utf-8") as f:
            f.write(stacks.text(fold=False) + "\n\n" + "\n\n".join(
                f"--- rank {rank} ---\n{text}" for rank, text in sorted(stacks.items())) + "\n")
        return stacks
