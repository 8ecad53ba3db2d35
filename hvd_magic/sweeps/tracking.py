"""A sweep in MLflow, when tracking is on (``--mlflow``, ``mlflow=``, or the notebook's active
MLflow run): a parent run for the sweep, and each trial's run nested under it.

The parent is made here (nested under the notebook's active run, if any) and made the active
run of the sweep's scheduler thread (MLflow's active run is per thread), where every trial is
launched: each trial then asks `hvd_magic.driver.tracking` for a run of its own in the parent's
experiment, which it nests under the active one. The parent gets the sweep's parameters, the
best value and trial, and the table (``trials.csv``, ``trials.json``); it ends FINISHED, FAILED
or KILLED with the sweep.

Not for: a trial's own logging (`hvd_magic.driver.tracking`, unchanged).
"""

import os
import sys

from IPython.core.error import UsageError

STATUS = {"done": "FINISHED", "cancelled": "KILLED"}   # any other end is FAILED


def sweep_tracking(option, name):
    """The sweep's `SweepTracking`, or None when it is not tracked (`option`: the run option
    ``mlflow``: None the notebook's active run if any, False never, True or an experiment)."""
    if option is False:
        return None
    mlflow = sys.modules.get("mlflow")
    if option is None and (mlflow is None or mlflow.active_run() is None):
        return None
    try:
        import mlflow
    except ImportError:
        raise UsageError("--mlflow needs MLflow in this environment: pip install "
                         "'hvd_magic[mlflow]' (or mlflow).") from None
    client = mlflow.MlflowClient()
    active = mlflow.active_run()
    if isinstance(option, str) and option:
        found = client.get_experiment_by_name(option)
        experiment = found.experiment_id if found else client.create_experiment(option)
    elif active is not None:
        experiment = active.info.experiment_id
    else:
        from ..compat import mlflow as mlflow_compat  # what mlflow.start_run() would use
        experiment = mlflow_compat.current_experiment_id()
    tags = {"mlflow.parentRunId": active.info.run_id} if active is not None else {}
    created = client.create_run(experiment, run_name=name, tags=tags)
    return SweepTracking(mlflow, client, created.info.run_id,
                         client.get_experiment(experiment).name)


class SweepTracking:
    def __init__(self, mlflow, client, run_id, experiment):
        self.mlflow, self.client, self.run_id, self.experiment = mlflow, client, run_id, experiment

    def begin(self, sweep):
        """In the scheduler thread: the parent is its active run (trials nest under it)."""
        self.mlflow.start_run(run_id=self.run_id)
        params = {"trials": len(sweep.trials), "np": sweep.ranks, "metric": sweep.metric,
                  "mode": sweep.mode, "slots": sweep.slots.total,
                  "trials_at_once": sweep.trials_at_once, "sweep_id": sweep.id,
                  **{f"space.{k}": v for k, v in sweep.space.items()}}
        self.client.log_batch(self.run_id, params=[
            self.mlflow.entities.Param(k, str(v)[:6000]) for k, v in params.items()])

    def trial_options(self, trial):
        """What a trial's run is launched with: a run of its own in the parent's experiment."""
        return {"mlflow": self.experiment, "name": f"trial {trial.number}"}

    def end(self, sweep):
        best = sweep.best
        if best is not None:
            self.client.log_metric(self.run_id, f"best {sweep.metric}", best.value)
            self.client.set_tag(self.run_id, "hvd_magic.best_trial", str(best.trial.number))
        for name in ("trials.csv", "trials.json"):
            path = os.path.join(sweep.folder, name)
            if os.path.exists(path):
                self.client.log_artifact(self.run_id, path, "hvd_magic")
        self.mlflow.end_run(STATUS.get(sweep.state, "FAILED"))
