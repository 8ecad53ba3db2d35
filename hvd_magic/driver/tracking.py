"""MLflow, when it is there: a run's parameters, rank 0's metrics, every rank's system metrics
(CPU, memory, GPUs: `hvd_magic.task.resources`), its files and its end, logged
to the notebook's active MLflow run (or to a run of its own with ``--mlflow [EXPERIMENT]``).

`mlflow_tracker` decides whether a launch is tracked, before it starts: the notebook's active run
(``with mlflow.start_run():`` or ``mlflow.start_run()`` earlier) is used as it is, and left
running; ``--mlflow`` without an active run makes a run that ends with the launch, FINISHED,
FAILED (the error's summary in the tag ``hvd_magic.error``) or KILLED. The ranks get
``MLFLOW_TRACKING_URI`` and ``MLFLOW_RUN_ID``, so ``mlflow.log_metric`` on a rank lands in that
run too.

`MlflowTracker` is shaped like a view (`start/event/tick/finish`) and wraps the run's view: the
driver loop feeds it the same events. Metrics are kept and sent with ``log_batch`` at most once
a second, from a thread of its own (a call per point would cost more than a short training
step, and MLflow's store takes tens of milliseconds per batch); params once the
launcher is known; the cell or script and the run folder as artifacts at the end. A tracking
server that stops answering costs a warning, never the run.

Nothing here imports mlflow unless it was asked for, or the notebook has imported it already.
"""

import math
import os
import queue
import sys
import threading
import time
from importlib import metadata

from IPython.core.error import UsageError

FLUSH_EVERY = 1.0        # seconds between two log_batch calls while the run goes
BATCH_LIMIT = 1000       # metrics per log_batch (MLflow's own limit)
SYSTEM_EVERY = 10        # one resources sample (a second each) in this many is logged
STATUS = {"done": "FINISHED", "cancelled": "KILLED"}   # any other end is FAILED


def _versions():
    versions = {}
    for name in ("horovod", "torch", "tensorflow"):
        for dist in (name, f"{name}-cpu"):  # tensorflow-cpu is TensorFlow too
            try:
                versions[f"{name}_version"] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions


def _absolute(uri):
    """A tracking URI the ranks can use from their own working folder."""
    if "://" not in uri and not uri.startswith("file:"):
        return "file://" + os.path.abspath(uri)
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file://" + os.path.abspath(uri[len("file:"):])
    return uri


def tracked(option, view, env, job, cell=None, options=None):
    """(view, env) of a launch: wrapped by its `MlflowTracker` and with the variables its ranks
    need to log to the same run, when it is tracked; as they were when not."""
    options = options or {}
    tracker = mlflow_tracker(option, options.get("name"))
    if tracker is None:
        return view, env
    script = job.get("script")
    params = dict(options, script=script[0], script_args=" ".join(script[1:])) if script \
        else options
    if script:
        artifacts = {os.path.basename(script[0]): next(iter(job["sources"].values()))}
    else:
        # the cell's source starts with blank lines standing for the %%horovod line
        artifacts = {"cell.py": getattr(cell, "source", "").lstrip("\n")}
    return tracker.wrap(view, params, artifacts), {**tracker.env, **(env or {})}


def mlflow_tracker(option, name=None):
    """The tracker of a launch, or None. `option`: None (the notebook's active MLflow run, if
    there is one), False (never), True (a new run in the current experiment unless one is
    active), or an experiment's name (a new run in it)."""
    if option is False:
        return None
    if option == "":  # --mlflow= (before a script's path): the current experiment
        option = True
    if option is None:
        mlflow = sys.modules.get("mlflow")  # never imported: nothing can be active
        if mlflow is None or mlflow.active_run() is None:
            return None
    else:
        try:
            import mlflow
        except ImportError:
            raise UsageError("--mlflow needs MLflow in this environment: pip install "
                             "'hvd_magic[mlflow]' (or mlflow), then run again. Without --mlflow "
                             "nothing is logged.") from None
    client = mlflow.MlflowClient()
    active = mlflow.active_run()
    if active is not None and not isinstance(option, str):
        return MlflowTracker(mlflow, client, active.info.run_id, own=False)
    if isinstance(option, str) and option:
        found = client.get_experiment_by_name(option)
        experiment = found.experiment_id if found else client.create_experiment(option)
    else:
        from ..compat.mlflow import current_experiment_id
        experiment = current_experiment_id()  # what mlflow.start_run() uses
    tags = {"mlflow.parentRunId": active.info.run_id} if active is not None else {}
    created = client.create_run(experiment, run_name=name, tags=tags)
    return MlflowTracker(mlflow, client, created.info.run_id, own=True)


class MlflowTracker:
    """A launch's MLflow logging, fed like a view; it passes everything on to `view`."""

    def __init__(self, mlflow, client, run_id, own):
        self.mlflow = mlflow
        self.client = client
        self.run_id = run_id
        self.own = own               # a run made for this launch: ended with it
        self.view = None
        self.params = {}             # what to log once the launcher is known
        self.artifacts = {}          # file name -> text (the cell, the script)
        self.pending = []            # metrics not sent yet
        self.points = 0              # rank 0's points seen
        self.system_seen = {}        # rank -> its resources samples seen
        self.last_flush = time.monotonic()
        self._params_logged = False
        self._warned = False
        self._sender = None          # the thread that sends metrics, once there are some
        self._outbox = queue.Queue()

    @property
    def env(self):
        """What the ranks need to log to the same run."""
        return {"MLFLOW_TRACKING_URI": _absolute(self.mlflow.get_tracking_uri()),
                "MLFLOW_RUN_ID": self.run_id}

    def wrap(self, view, params, artifacts):
        self.view = view
        self.params = dict(params, **_versions())
        self.artifacts = artifacts
        return self

    # -- the view's calls ---------------------------------------------------------------------
    def start(self, run):
        if self.view is not None:
            self.view.start(run)

    def event(self, run, rank, event):
        if rank == 0 and event.get("t") == "progress" and isinstance(event.get("points"), list):
            self._keep(event["points"])
        elif event.get("t") == "resources":
            self._keep_system(rank, event)
        if self.view is not None:
            self.view.event(run, rank, event)

    def tick(self, run):
        if self.view is not None:
            self.view.tick(run)
        if not self._params_logged and run.where is not None:
            self._safely(self._log_params, run)
        if self.pending and time.monotonic() - self.last_flush >= FLUSH_EVERY:
            self.flush()

    def finish(self, run):
        if self.view is not None:
            self.view.finish(run)
        self._safely(self._log_params, run)
        self.flush()
        if self._sender is not None:  # every metric is in before the run is ended
            self._outbox.put(None)
            self._sender.join()
        self._safely(self._log_files, run)
        self._safely(self._end, run)

    # -- logging ------------------------------------------------------------------------------
    def _keep(self, points):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for point in points:
            if not (isinstance(point, list) and len(point) == 2 and isinstance(point[1], dict)):
                continue
            step = point[0] if isinstance(point[0], int) else 0
            self.points += 1
            for key, value in point[1].items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and math.isfinite(value):
                    self.pending.append(Metric(str(key), float(value), now, step))

    def _keep_system(self, rank, event):
        """A rank's resources sample under MLflow's own system-metric names, with the rank as
        MLflow's node id (``system/rank_1/cpu_utilization_percentage``): the run reads in MLflow
        as MLflow's own system metrics would. One sample in SYSTEM_EVERY (MLflow samples every
        10 s), the first one included."""
        from mlflow.entities import Metric

        seen = self.system_seen[rank] = self.system_seen.get(rank, -1) + 1
        if seen % SYSTEM_EVERY:
            return
        step, now = seen // SYSTEM_EVERY, int(time.time() * 1000)
        rss, limit = event.get("rss") or 0, event.get("limit") or 0
        values = {"cpu_utilization_percentage": event.get("cpu") or 0.0,
                  "system_memory_usage_megabytes": rss / 1e6}
        if limit:
            values["system_memory_usage_percentage"] = 100.0 * rss / limit
        for gpu in event.get("gpus") or ():
            i, mem, total = gpu.get("index"), gpu.get("mem") or 0, gpu.get("mem_total") or 0
            values[f"gpu_{i}_memory_usage_megabytes"] = mem / 1e6
            if total:
                values[f"gpu_{i}_memory_usage_percentage"] = 100.0 * mem / total
            if gpu.get("util") is not None:
                values[f"gpu_{i}_utilization_percentage"] = float(gpu["util"])
        self.pending += [Metric(f"system/rank_{rank}/{name}", float(value), now, step)
                         for name, value in values.items()]

    def flush(self):
        """Hand the kept metrics to the sender thread: a log_batch takes tens of milliseconds
        (MLflow's store writes each metric), which the driver loop, its view and its stop
        requests should not wait for."""
        pending, self.pending = self.pending, []
        self.last_flush = time.monotonic()
        if not pending:
            return
        if self._sender is None:
            self._sender = threading.Thread(target=self._send, name="hvd-magic-mlflow",
                                            daemon=True)
            self._sender.start()
        self._outbox.put(pending)

    def _send(self):
        while True:
            metrics = self._outbox.get()
            if metrics is None:
                return
            for i in range(0, len(metrics), BATCH_LIMIT):
                self._safely(self._log_batch, metrics[i:i + BATCH_LIMIT])

    def _log_batch(self, metrics):
        self.client.log_batch(self.run_id, metrics=metrics)

    def _log_params(self, run):
        if self._params_logged:
            hosts = sorted({r.host for r in run.ranks if r.host})
            if hosts and "hosts" not in self.params:  # known once the ranks started
                self._new_params({"hosts": ",".join(hosts)})
            return
        self._params_logged = True
        self.params.update(np=run.np, launcher=run.where or "not started")
        self._new_params(self.params)

    def _new_params(self, params):
        """Log `params`, less those the run has already (a notebook's run that several launches
        log to: MLflow refuses to change a param, so the first launch's stay)."""
        from mlflow.entities import Param

        self.params.update(params)
        have = self.client.get_run(self.run_id).data.params
        new = [Param(k, str(v)[:6000]) for k, v in params.items() if v is not None and k not in have]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i:i + 100])

    def _log_files(self, run):
        where = f"hvd_magic/{run.id}"
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in self.artifacts.items():
                path = os.path.join(tmp, name)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                self.client.log_artifact(self.run_id, path, where)
        if os.path.isdir(run.run_dir):
            self.client.log_artifacts(self.run_id, run.run_dir, f"{where}/run")

    def _end(self, run):
        status = STATUS.get(run.state, "FAILED")
        self.client.set_tag(self.run_id, "hvd_magic.status", status)
        if run.error is not None:
            headline = getattr(run.error, "headline", None)
            summary = headline() if headline else (str(run.error).strip().splitlines() or [""])[0]
            self.client.set_tag(self.run_id, "hvd_magic.error", summary[:5000])
        if self.own:
            self.client.set_terminated(self.run_id, status)

    def _safely(self, call, *args):
        try:
            call(*args)
        except Exception as exc:  # the tracking server is down, say: the run goes on
            if not self._warned:
                self._warned = True
                print(f"[hvd_magic] MLflow logging failed (run {self.run_id}): {exc}",
                      file=sys.stderr)
