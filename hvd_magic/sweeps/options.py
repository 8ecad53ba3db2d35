"""What a person asked a sweep for, checked once: `SweepOptions` (the space, the search, how
many trials at once, the metric and the early stop), carried whole from ``--sweep`` or
``hvd_magic.sweep(...)`` to the `Sweep`.

Not for: a trial's own run options (`hvd_magic.config.RunOptions`, shared by every trial).
"""

import dataclasses
from typing import Any, Optional

from IPython.core.error import UsageError

from .space import check_space, parse_search, points_of
from .stopping import make_rule


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """`params`: {name: [values]} or ``"lr=1e-3,1e-2; width=64,128"``; `search`: "grid",
    "random:N", "optuna:N", or an Optuna study or sampler (`trials` of them, default 10);
    `trials_at_once`: at most this many trials run
    together (None: as many as the slots hold); `metric`, `mode`: what ``hvd_magic.report``
    reports that ranks the trials ("min" or "max"); `early_stop`: None, "median", "asha"
    (":G" after G steps) or a rule; `fail_fast`: a failing trial cancels the sweep; `slots`:
    how many ranks may run at once (None: counted, `hvd_magic.sweeps.slots`); `seed`: a random
    search's."""

    params: Any = None
    search: Any = "grid"
    trials_at_once: Optional[int] = None
    metric: str = "loss"
    mode: str = "min"
    early_stop: Any = None
    fail_fast: bool = False
    slots: Optional[int] = None
    seed: Optional[int] = None
    trials: Optional[int] = None   # an Optuna study's or sampler's trials

    def __post_init__(self):
        object.__setattr__(self, "params", check_space(self.params))
        if isinstance(self.search, str):
            parse_search(self.search)
        for name in ("trials_at_once", "slots", "trials"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise UsageError(f"{name} takes a whole number >= 1 (or None), not {value!r}.")
        if self.mode not in ("min", "max"):
            raise UsageError(f"mode takes 'min' (a loss) or 'max' (an accuracy), not "
                             f"{self.mode!r}.")
        if not isinstance(self.metric, str) or not self.metric:
            raise UsageError(f"metric takes the name of a reported metric (hvd_magic.report("
                             f"step=..., loss=...): 'loss'), not {self.metric!r}.")
        make_rule(self.early_stop)  # (checked here: a UsageError before anything starts)

    @property
    def rule(self):
        return make_rule(self.early_stop)

    @property
    def optuna(self):
        """Whether the search is Optuna's (a study, a sampler, "optuna:N")."""
        return not isinstance(self.search, str) or parse_search(self.search)[0] == "optuna"

    def points(self):
        """The trials' values (a grid's or a random search's; an Optuna search's trials are
        asked as they start: {} each here)."""
        if not isinstance(self.search, str):
            return [{} for _ in range(self.trials or 10)]
        return points_of(self.params, self.search, self.seed)

    def searcher(self):
        """The Optuna search (`hvd_magic.sweeps.optuna_search`), or None."""
        if not self.optuna:
            return None
        from .optuna_search import OptunaSearch
        return OptunaSearch(self.search, self.params, self.mode)
