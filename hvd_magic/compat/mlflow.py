"""MLflow's private choice of the experiment a new run goes to (what ``mlflow.start_run()``
uses: the one ``mlflow.set_experiment`` set, ``MLFLOW_EXPERIMENT_NAME``/``_ID``, a Databricks
notebook's own, else the default). Imports MLflow only where the caller already has
(`hvd_magic.driver.tracking`).
"""

import os

from . import private

DEFAULT_EXPERIMENT = "0"


def current_experiment_id():
    """The id of the experiment ``mlflow.start_run()`` would log to. Where this MLflow has no
    ``fluent._get_experiment_id``: ``MLFLOW_EXPERIMENT_ID``, else the default experiment (an
    experiment chosen with ``mlflow.set_experiment`` is not followed; said once)."""
    from mlflow.tracking import fluent

    choose = private(fluent, "_get_experiment_id", "mlflow",
                     "the active experiment (fluent._get_experiment_id)",
                     "--mlflow logs to MLFLOW_EXPERIMENT_ID or the Default experiment; name one "
                     "with --mlflow EXPERIMENT")
    if choose is not None:
        return choose()
    return os.environ.get("MLFLOW_EXPERIMENT_ID") or DEFAULT_EXPERIMENT
