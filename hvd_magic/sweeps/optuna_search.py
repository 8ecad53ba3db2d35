"""An Optuna search for a sweep: the study lives in the notebook's process; the ranks never
import Optuna.

Each trial's values are asked of the study when the trial is admitted (so a sampler such as
TPE learns from the trials that ended before), suggested from the sweep's space (a list:
categorical; a ``(low, high)`` range: an int or float, on a log scale when it spans two decades
or more). Rank 0's reported points go to the Optuna trial (``report(value, step)``), and the
study's pruner decides, through ``should_prune()``, the early stop that
`hvd_magic.sweeps.trial` then carries to every rank. A trial's end is told to the study:
complete with its last value, pruned, or failed. Every call is made by the sweep's scheduler
thread alone.

Not for: the grid and random searches (`hvd_magic.sweeps.space`).
"""

from IPython.core.error import UsageError


def _optuna():
    try:
        import optuna
    except ImportError:
        raise UsageError("An Optuna search needs optuna in the notebook's environment: "
                         "pip install optuna (the ranks do not need it).") from None
    return optuna


class OptunaSearch:
    """`search`: an `optuna.Study`, an `optuna.samplers.BaseSampler` (a study made with it), or
    "optuna" (a study with Optuna's defaults); `mode` the study's direction."""

    def __init__(self, search, space, mode):
        optuna = _optuna()
        direction = "minimize" if mode == "min" else "maximize"
        if isinstance(search, optuna.study.Study):
            study = search
            if study.direction.name.lower() != direction:
                raise UsageError(f"The study's direction is {study.direction.name.lower()} and "
                                 f"the sweep's mode is {mode!r}: give mode="
                                 f"{'min' if study.direction.name == 'MINIMIZE' else 'max'!r}.")
        elif isinstance(search, optuna.samplers.BaseSampler):
            study = optuna.create_study(direction=direction, sampler=search)
        else:
            study = optuna.create_study(direction=direction)
        self.study, self.space = study, space
        self.asked = {}      # sweep trial number -> optuna trial
        self.reported = {}   # sweep trial number -> points already reported

    def ask(self, trial):
        asked = self.study.ask()
        self.asked[trial.number] = asked
        return {name: self._suggest(asked, name, values) for name, values in self.space.items()}

    @staticmethod
    def _suggest(asked, name, values):
        if not isinstance(values, tuple):
            return asked.suggest_categorical(name, list(values))
        low, high = values
        log = low > 0 and high / low >= 100
        if isinstance(low, int) and isinstance(high, int):
            return asked.suggest_int(name, low, high, log=log)
        return asked.suggest_float(name, float(low), float(high), log=log)

    def should_stop(self, trial):
        """Rank 0's new points reported to the study; the pruner's answer."""
        asked = self.asked.get(trial.number)
        if asked is None:
            return False
        done = self.reported.get(trial.number, 0)
        seen = set()
        for step, value in trial.curve[done:]:
            step = int(step)
            if step not in seen:  # (a step reported twice counts once)
                seen.add(step)
                asked.report(value, step)
        self.reported[trial.number] = len(trial.curve)
        return asked.should_prune()

    def tell(self, trial):
        optuna = _optuna()
        asked = self.asked.pop(trial.number, None)
        if asked is None:
            return
        if trial.state == "done" and trial.last is not None:
            self.study.tell(asked, trial.last)
        elif trial.state == "stopped":
            self.study.tell(asked, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(asked, state=optuna.trial.TrialState.FAIL)
