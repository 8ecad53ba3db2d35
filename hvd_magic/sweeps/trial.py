"""One trial of a sweep: its values, its run, its state, its metric's curve, and its early stop.

A trial is a run like any other (`hvd_magic.driver.run.Run`, started in the background by the
sweep) whose view is the trial's `TrialView`: through it the trial sees rank 0's reported
points (its curve) and the ranks' answers to an early stop.

An early stop (`StopAgreement`) is two words to every rank on the run's channel, ``pending``
then ``stop`` at step ``k``, and the ranks' ``trial_at`` answers in between: the protocol and
why no rank can pass ``k`` are in `hvd_magic.rank.trial`. Its ranks must end within
`STOP_DEADLINE` seconds of the second word, else the run is cancelled (the trial is still
"stopped at step k").

Not for: when to stop (`hvd_magic.sweeps.stopping`), or which trial runs when
(`hvd_magic.sweeps.runner`).
"""

import threading
import time

GRACE = 1.0            # seconds after the first rank's answer before ranks that gave none are
                       # taken as inside a collective (k is then one step further)
NO_ANSWER = 30.0       # seconds without any rank's answer: the trial is cancelled
STOP_DEADLINE = 15.0   # seconds after ``stop`` at k for every rank to have ended

ENDED = ("done", "stopped", "failed", "cancelled")


class StopAgreement:
    """The step ``k`` at which every rank of a trial's run leaves (`hvd_magic.rank.trial`)."""

    def __init__(self, run, reason):
        self.run, self.reason = run, reason
        self.answers = {}           # rank -> the step it waits at
        self.first_answer = None
        self.step = None            # k, once decided
        self.decided_at = None
        self.asked_at = time.monotonic()
        run.announce({"t": "trial", "phase": "pending"})

    def heard(self, rank, step):
        if isinstance(step, (int, float)) and self.step is None:
            self.answers[rank] = step
            self.first_answer = self.first_answer or time.monotonic()
            self.decide()

    def decide(self, now=None):
        """Say ``k`` once every rank answered, or `GRACE` after the first answer."""
        now = time.monotonic() if now is None else now
        if self.step is not None or not self.answers:
            return
        everyone = len(self.answers) >= self.run.np
        if not everyone and now - self.first_answer < GRACE:
            return
        self.step = max(self.answers.values()) + (0 if everyone else 1)
        self.decided_at = now
        self.run.announce({"t": "trial", "phase": "stop", "step": self.step})

    def overdue(self, now=None):
        now = time.monotonic() if now is None else now
        if self.decided_at is not None:
            return now - self.decided_at > STOP_DEADLINE
        return self.first_answer is None and now - self.asked_at > NO_ANSWER


class Trial:
    """A trial: `values` (the sweep's parameters for it), `state` (waiting, running, stopping,
    done, stopped, failed, cancelled), its `run` once started, `error`, `stopped_at` (the step),
    `curve` ([(step, value)] of the sweep's metric on rank 0), `metrics` (rank 0's latest)."""

    def __init__(self, number, values, metric):
        self.number, self.values, self.metric = number, dict(values), metric
        self.state = "waiting"
        self.waiting_for = None     # what a waiting trial waits for ("2 slots, 0 free")
        self.run = None
        self.error = None
        self.stopped_at = None
        self.stopping = None        # the `StopAgreement`, once asked
        self.curve = []
        self.metrics = {}
        self.step = None
        self.started = self.ended = None
        self.new_points = False     # since the sweep's stopping rule last looked
        self._ended = threading.Event()

    # -- numbers ------------------------------------------------------------------------------
    @property
    def last(self):
        return self.curve[-1][1] if self.curve else None

    def best_value(self, mode):
        values = [v for _, v in self.curve]
        if not values:
            return None
        return min(values) if mode == "min" else max(values)

    @property
    def elapsed(self):
        if self.started is None:
            return None
        return (self.ended or time.time()) - self.started

    @property
    def ended_state(self):
        return self.state in ENDED

    # -- the run's events (`TrialView`) -------------------------------------------------------
    def took(self, rank, event):
        kind = event.get("t")
        if kind == "progress" and rank == 0:
            self.step = event.get("step", self.step)
            for point in event.get("points") or ():
                if isinstance(point, list) and len(point) == 2 and isinstance(point[1], dict):
                    self.metrics.update(point[1])
                    value = point[1].get(self.metric)
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        self.curve.append((point[0], float(value)))
                        self.new_points = True
            if isinstance(event.get("metrics"), dict):
                self.metrics.update(event["metrics"])
        elif kind == "trial_at" and self.stopping is not None:
            self.stopping.heard(rank, event.get("step"))
        elif kind == "trial_stopped" and self.stopping is not None:
            self.stopped_at = event.get("step")

    def finished(self, run):
        """Its run ended: the trial's state from the run's."""
        self.ended = time.time()
        # stopped: its ranks left at the agreed step (they said so), or were ended past the
        # deadline; a run that ended on its own before the step was agreed is done
        if self.stopping is not None and self.stopping.reason != "cancelled" and (
                self.stopped_at is not None or run.state == "cancelled"):
            self.state = "stopped"
            self.stopped_at = self.stopping.step if self.stopped_at is None else self.stopped_at
        elif self.stopping is not None:
            self.state = "cancelled"
        elif run.state == "done":
            self.state = "done"
        else:
            self.state = "cancelled" if run.state == "cancelled" else "failed"
            self.error = run.error
        self._ended.set()

    # -- stopping -----------------------------------------------------------------------------
    def stop_early(self, reason="stopped"):
        """Stop every rank of the trial at one step (a running trial), or drop it (waiting)."""
        if self.state == "waiting":
            self.state, self.ended = "cancelled", time.time()
            self._ended.set()
        elif self.state == "running" and self.run is not None:
            self.state = "stopping"
            self.stopping = StopAgreement(self.run, reason)

    def cancel(self):
        """End its ranks now (no agreement on a step)."""
        if self.state == "waiting":
            self.stop_early("cancelled")
        elif self.run is not None and not self.ended_state:
            if self.stopping is None:
                self.stopping = _Cancelled()
            self.run.cancel()

    def watch_stop(self, now=None):
        """The scheduler's tick: a decision due, or a deadline passed (then cancel the run)."""
        if self.stopping is None or self.ended_state or isinstance(self.stopping, _Cancelled):
            return
        self.stopping.decide(now)
        if self.stopping.overdue(now):
            self.run.cancel()

    def wait(self, timeout=None):
        return self._ended.wait(timeout)

    def as_row(self, mode):
        return {"trial": self.number, **self.values, "state": self.state,
                "step": self.step, self.metric: self.last,
                f"best {self.metric}": self.best_value(mode),
                "stopped at": self.stopped_at,
                "seconds": None if self.elapsed is None else round(self.elapsed, 2),
                "error": None if self.error is None else f"{type(self.error).__name__}: "
                                                         f"{str(self.error).splitlines()[0]}"
                if str(self.error) else type(self.error).__name__,
                "run": self.run.id if self.run is not None else None}

    def __repr__(self):
        values = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"<Trial {self.number} {values} {self.state}>"


class _Cancelled:
    """A trial cancelled by the sweep (its button, an interrupt): no step agreed."""
    reason = "cancelled"
    step = None


class TrialView:
    """The view of a trial's run: its events to the trial. (A trial's ranks are shown by its
    run itself, opened from the sweep's view.)"""

    def __init__(self, trial):
        self.trial = trial

    def start(self, run):
        pass

    def event(self, run, rank, event):
        self.trial.took(rank, event)

    def tick(self, run):
        pass

    def finish(self, run):
        self.trial.finished(run)
