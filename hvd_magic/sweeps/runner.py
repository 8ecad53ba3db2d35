"""`Sweep`: several trials of one function or cell, run as gangs that share the slots.

A scheduler thread admits waiting trials in order while the slots hold all of a trial's ranks
(`hvd_magic.sweeps.slots`) and fewer than ``trials_at_once`` run; each admitted trial is a run
started in the background (`launch(values, view=..., run_dir=..., env=...)`, given by the API:
`hvd_magic.sweeps.api`), whose view is the trial's (`hvd_magic.sweeps.trial.TrialView`). When a
trial's run ends its slots go back and the next waiting trial starts. The stopping rule
(`hvd_magic.sweeps.stopping`) is asked whenever a trial has new points; a failing trial is a row
with its error (``fail_fast`` cancels the rest). The sweep's folder holds every trial's run
folder and ``trials.csv`` / ``trials.json``.

Not for: showing it (`hvd_magic.sweeps.view`), or parsing what a person asked.
"""

import datetime
import json
import os
import secrets
import threading
import time

from .trial import Trial, TrialView

TICK = 0.05  # seconds between the scheduler's looks


def new_sweep_id():
    return "sweep-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


class Sweep:
    """Trials of one function or cell; `table()`, `best`, `wait()`, `cancel()`, `trials`."""

    def __init__(self, launch, points, ranks, slots, *, trials_at_once=None, metric="loss",
                 mode="min", rule=None, fail_fast=False, run_root="hvd_runs", name=None,
                 params=(), search=None, space=None, tracking=None):
        self.id = new_sweep_id()
        self.name = name
        self._launch = launch
        self.ranks, self.slots = ranks, slots
        self.trials_at_once = trials_at_once
        self.metric, self.mode, self.rule, self.fail_fast = metric, mode, rule, fail_fast
        self.search = search          # an Optuna search (hvd_magic.sweeps.optuna_search)
        self.space = dict(space or {})
        self.tracking = tracking      # MLflow's parent run (hvd_magic.sweeps.tracking)
        self.params = list(params) or sorted({k for p in points for k in p})
        self.folder = os.path.abspath(os.path.join(run_root, self.id))
        self.trials = [Trial(i, p, metric) for i, p in enumerate(points)]
        self.state = "pending"
        self.started = self.ended = None
        self.error = None             # fail_fast's trial error, or an internal one
        self.view = None              # a background sweep's view, ticked by the scheduler
        self._cancelled = False
        self._done = threading.Event()
        self._thread = None

    # -- running ------------------------------------------------------------------------------
    def start(self):
        os.makedirs(self.folder, exist_ok=True)
        self.started, self.state = time.time(), "running"
        self._thread = threading.Thread(target=self._schedule, name=f"hvd-magic-{self.id}",
                                        daemon=True)
        self._thread.start()
        return self

    def _schedule(self):
        try:
            if self.tracking is not None:
                self.tracking.begin(self)
            while not self._tick():
                if self.view is not None:
                    self.view.tick(self)
                time.sleep(TICK)
        except BaseException as exc:  # a bug of ours: every trial cancelled, the sweep failed
            self.error = exc
            self._cancel_all()
        finally:
            self._end()

    def _tick(self):
        """One look: ended trials' slots back, stopping decisions, new trials admitted; True
        once every trial ended."""
        for trial in self.running():
            if trial.ended_state:
                self.slots.give_back(trial.number)
                if self.search is not None:
                    self.search.tell(trial)
                if trial.state == "failed" and self.fail_fast and not self._cancelled:
                    self.error = trial.error
                    self._cancel_all()
            else:
                trial.watch_stop()
                self._maybe_stop(trial)
        self._admit()
        return all(t.ended_state for t in self.trials)

    def running(self):
        return [t for t in self.trials if t.number in self.slots.held]

    def _admit(self):
        for trial in self.trials:
            if trial.state != "waiting" or self._cancelled:
                continue
            if self.trials_at_once is not None and len(self.running()) >= self.trials_at_once:
                trial.waiting_for = f"{self.trials_at_once} trials at once (--trials-at-once)"
                continue
            held = self.slots.take(trial.number, self.ranks)
            if held is None:
                trial.waiting_for = self.slots.waiting_text(self.ranks)
                continue  # (a later trial needs as many: it waits too, in order)
            self._start_trial(trial, held)

    def _start_trial(self, trial, held):
        trial.state, trial.waiting_for, trial.started = "running", None, time.time()
        if self.search is not None:  # (asked now: the study knows the trials that ended)
            trial.values = self.search.ask(trial)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(held)} if isinstance(held, list) else {}
        view = TrialView(trial)
        more = self.tracking.trial_options(trial) if self.tracking is not None else {}
        try:
            trial.run = self._launch(trial.values, view=view, env=env,
                                     run_dir=os.path.join(self.folder, f"trial-{trial.number}"),
                                     **more)
        except BaseException as exc:  # refused before its ranks started (its own UsageError)
            trial.error = trial.error or exc
            if not trial.ended_state:
                trial.state, trial.ended = "failed", time.time()
                trial._ended.set()
        if trial.run is not None:
            self._write_values(trial)
            if self._cancelled:  # (cancelled while its run was being started)
                trial.cancel()

    def _maybe_stop(self, trial):
        if trial.state != "running" or not trial.new_points:
            return
        trial.new_points = False
        if self.search is not None and self.search.should_stop(trial):
            trial.stop_early()
        elif self.rule is not None and self.rule.should_stop(
                trial.number, {t.number: t.curve for t in self.trials}, self.mode):
            trial.stop_early()

    def _write_values(self, trial):
        path = os.path.join(trial.run.run_dir, "trial.json")
        with open(path, "w") as f:
            json.dump({"sweep": self.id, "trial": trial.number, "values": trial.values}, f,
                      default=repr)

    def _end(self):
        self.ended = time.time()
        self.state = ("failed" if self.error is not None else
                      "cancelled" if self._cancelled else "done")
        try:
            self.write_table()
            if self.tracking is not None:
                self.tracking.end(self)
        finally:
            self._done.set()
            if self.view is not None:
                self.view.finish(self)

    # -- the user's handle --------------------------------------------------------------------
    def wait(self, timeout=None):
        """Wait for every trial to end; return the sweep (raise fail_fast's error)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.id} is still running after {timeout} s")
        if self.error is not None and self.fail_fast:
            raise self.error
        return self

    @property
    def done(self):
        return self._done.is_set()

    def ended_within(self, seconds):
        """Whether the sweep ended, waiting at most `seconds` for it."""
        return self._done.wait(seconds)

    def cancel(self):
        """End every trial's ranks now; waiting trials never start."""
        self._cancelled = True
        self._cancel_all()

    def _cancel_all(self):
        self._cancelled = True
        for trial in self.trials:
            trial.cancel()

    def stop_trial(self, number):
        """Stop one trial early (every rank at the same step), as the stopping rule would."""
        self.trials[number].stop_early()

    def rerun(self, values, np=None, **options):
        """`values` run once more, in the foreground (`np`: another size); the `Run`."""
        return self._launch(values, np=np, rerun=True, **options)

    @property
    def best(self):
        """The trial with the best value of the metric (stopped trials count, failed do not);
        None while no trial reported it."""
        scored = [t for t in self.trials if t.state != "failed" and
                  t.best_value(self.mode) is not None]
        if not scored:
            return None
        pick = min if self.mode == "min" else max
        trial = pick(scored, key=lambda t: t.best_value(self.mode))
        return BestTrial(self, trial)

    def table(self):
        """A pandas DataFrame: a row per trial, a column per parameter, its state and metric."""
        import pandas as pd
        return pd.DataFrame(self.rows()).set_index("trial")

    def rows(self):
        return [t.as_row(self.mode) for t in self.trials]

    def write_table(self):
        rows = self.rows()
        with open(os.path.join(self.folder, "trials.json"), "w") as f:
            json.dump({"id": self.id, "metric": self.metric, "mode": self.mode,
                       "state": self.state, "trials": rows}, f, default=repr, indent=1)
        import csv
        with open(os.path.join(self.folder, "trials.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["trial"])
            writer.writeheader()
            writer.writerows(rows)

    def __repr__(self):
        states = {}
        for t in self.trials:
            states[t.state] = states.get(t.state, 0) + 1
        said = ", ".join(f"{n} {s}" for s, n in states.items())
        return f"<Sweep {self.id} {len(self.trials)} trials: {said}>"


class BestTrial:
    """The best trial's `values`, `run` and `trial`; `rerun(np=...)` runs them again."""

    def __init__(self, sweep, trial):
        self.sweep, self.trial = sweep, trial
        self.values, self.run = dict(trial.values), trial.run
        self.value = trial.best_value(sweep.mode)

    def rerun(self, np=None, **options):
        """The best values again, in the foreground, at another size (`np`, as the sweep's
        own sign: -N on the driver) or with other run options; returns the `Run`."""
        return self.sweep.rerun(self.values, np=np, **options)

    def __getitem__(self, name):
        return self.values[name]

    def __repr__(self):
        values = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"<best trial {self.trial.number}: {values}; {self.sweep.metric} {self.value}>"
