"""When a sweep stops a trial early: median stopping and ASHA, from the metric each trial's
rank 0 reports (``hvd_magic.report(step=..., loss=...)``).

A rule is asked `should_stop(trial, curves)` each time the trial has new points; `curves` is
{trial number: [(step, value), ...]} of every trial so far (finished ones too). `mode` "min"
(a loss) or "max" (an accuracy). A rule only decides; `hvd_magic.sweeps.trial` carries the
decision to every rank of the trial (`hvd_magic.rank.trial`).

Not for: Optuna's pruners (a study's own, asked by `hvd_magic.sweeps.runner`).
"""

import statistics

from IPython.core.error import UsageError


def _best_until(curve, step, mode):
    values = [v for s, v in curve if s <= step]
    if not values:
        return None
    return min(values) if mode == "min" else max(values)


def _worse(a, b, mode):
    return a > b if mode == "min" else a < b


class MedianStopping:
    """Stop a trial whose best value up to step s is worse than the median of the other
    trials' best up to s (those that reached s), after `grace` steps and once `min_trials`
    others reached s (Google Vizier's rule)."""

    def __init__(self, grace=1, min_trials=2):
        self.grace, self.min_trials = grace, min_trials

    def should_stop(self, number, curves, mode):
        curve = curves.get(number) or []
        if not curve:
            return False
        step = curve[-1][0]
        if step < self.grace:
            return False
        mine = _best_until(curve, step, mode)
        others = [_best_until(c, step, mode) for n, c in curves.items()
                  if n != number and c and c[-1][0] >= step]
        others = [v for v in others if v is not None]
        if len(others) < self.min_trials:
            return False
        return _worse(mine, statistics.median(others), mode)

    def __repr__(self):
        return f"median(grace={self.grace})"


class ASHA:
    """Asynchronous successive halving: rungs at steps grace, grace*eta, grace*eta^2...; a trial
    reaching a rung goes on only if its value there is in the top 1/eta of the values recorded
    at that rung so far (at least `eta` of them)."""

    def __init__(self, grace=1, eta=3):
        self.grace, self.eta = grace, eta
        self.rungs = {}  # rung step -> {trial number: value}

    def _rungs(self, step):
        """Every rung at or below `step`, lowest first."""
        rungs, r = [], self.grace
        while r <= step:
            rungs.append(r)
            r *= self.eta
        return rungs

    def should_stop(self, number, curves, mode):
        curve = curves.get(number) or []
        rungs = self._rungs(curve[-1][0]) if curve else []
        if not rungs:
            return False
        for rung in rungs:  # (a batch of points may have passed several rungs at once)
            self.rungs.setdefault(rung, {}).setdefault(number, _best_until(curve, rung, mode))
        at = self.rungs[rungs[-1]]
        values = sorted(at.values(), reverse=(mode == "max"))
        if len(values) < self.eta:
            return False
        keep = max(1, len(values) // self.eta)
        cut = values[keep - 1]
        return _worse(at[number], cut, mode)

    def __repr__(self):
        return f"asha(grace={self.grace}, eta={self.eta})"


def make_rule(early_stop):
    """None, "median", "asha", "median:G" / "asha:G" (G: grace steps), or a rule object."""
    if early_stop is None or early_stop is False:
        return None
    if hasattr(early_stop, "should_stop"):
        return early_stop
    name, _, grace = str(early_stop).partition(":")
    grace = int(grace) if grace.isdigit() else 1
    if name == "median":
        return MedianStopping(grace=grace)
    if name == "asha":
        return ASHA(grace=grace)
    raise UsageError(f"--early-stop takes median or asha (with :G, the steps before a trial can "
                     f"be stopped, e.g. median:5), not {early_stop!r}.")
