"""A sweep trial's early stop, on the rank: every rank of the trial leaves at the same step.

The driver decides to stop a trial (`hvd_magic.sweeps.stopping`) while its ranks are at different
steps, so it cannot say "stop now". It says it in two words, on the run's channel (the task
relays them through the probe pipe: `hvd_magic.rank.stacks`):

1. ``pending``: from then on, each rank's next ``report(step=s)`` tells the driver ``s``
   (a ``trial_at`` event) and waits there for the second word;
2. ``stop`` at step ``k``: the largest step the ranks said, or one more when some rank did not
   say one within a grace (it is inside a collective, waiting for a rank that waits here: it
   finished at most the step the others finished, so it reaches step ``k`` as well once they
   go on). A rank at ``report(step >= k)`` raises `TrialStopped`, which the rank's bootstrap
   takes as a clean end (no value); a rank below ``k`` goes on to ``k`` and leaves there.

No rank can have passed ``k``: a rank that reports after ``pending`` waits, and a rank that
did not report finished no more steps than the ones that wait (the collectives of each step
need them all). Code without collectives between the reports (no lockstep) also stops at the
same ``k``: each rank waits at its first report, and ``k`` is the largest.

Not for: deciding (the driver does), or any collective of the user's: nothing here touches
the ranks' process group.
"""

import os
import threading

WAIT_SECONDS = float(os.environ.get("HVD_MAGIC_TRIAL_WAIT", "60"))  # for the second word


class TrialStopped(BaseException):
    """This sweep trial was stopped early at `step`; every rank of it leaves here. A
    BaseException (as KeyboardInterrupt): an ``except Exception`` in the training loop must
    not swallow it."""

    def __init__(self, step):
        super().__init__(f"the sweep stopped this trial at step {step}")
        self.step = step


class _Decision:
    def __init__(self):
        self.changed = threading.Condition()
        self.pending = False
        self.stop_at = None

    def heard(self, message):
        with self.changed:
            if message.get("phase") == "pending":
                self.pending = True
            elif message.get("phase") == "stop" and isinstance(message.get("step"), (int, float)):
                self.stop_at = message["step"]
            self.changed.notify_all()

    def at_step(self, step, send):
        """Called by ``report(step=...)``; raises `TrialStopped` where this rank must leave."""
        if not self.pending and self.stop_at is None:
            return  # (the common case: one attribute read per report)
        with self.changed:
            if self.stop_at is None and self.pending:
                send({"t": "trial_at", "step": step})
                self.changed.wait_for(lambda: self.stop_at is not None, WAIT_SECONDS)
            stop_at = self.stop_at
        if stop_at is not None and step >= stop_at:
            raise TrialStopped(stop_at)


_decision = _Decision()


def heard(message):
    """The driver's word on this trial (a dict with ``t`` ``trial``)."""
    _decision.heard(message)


def at_step(step, send):
    _decision.at_step(step, send)
