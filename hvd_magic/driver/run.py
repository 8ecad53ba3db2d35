"""`Run`: one launch of a function on N ranks, and the user's handle on it.

A run, from the driver's side:
1. `launch` opens an `EventServer` for the run, ships large values once per executor
   (`Launcher.share`), and asks the launcher to start the tasks;
2. the driver loop (`hvd_magic.driver.loop`) turns the tasks' events into per-rank state, full
   logs in the run folder and view updates, stops every rank as soon as one fails (or on
   interrupt / timeout);
3. at the end `hvd_magic.driver.ending` gathers the ranks' values in rank order, or the error.
"""

import datetime
import os
import pickle
import secrets
import threading
import time

from ..task.settings import TaskSettings
from . import history
from .folder import RunFolder
from .loop import Driver
from .ranks import RankState

DEFAULT_BROADCAST_BYTES = 4 * 1024 * 1024
DEFAULT_STALL_TIMEOUT = 60.0
DEFAULT_HOROVOD_ENV = {
    # horovodrun exports '(None,)' for these (a 0 ms cycle that spins); we set them ourselves.
    "HOROVOD_CYCLE_TIME": "1",
    "HOROVOD_CACHE_CAPACITY": "1024",
    # Bounds Gloo's waits for a peer: a frozen rank, and hvd.init() (which gives up after a few
    # times this). It must cover the skew of ranks reaching hvd.init() (under a second with
    # torch, seconds with TensorFlow on a loaded machine: bench/bench_reinit.py); a rank that
    # computes alone does not count (Horovod's background threads keep negotiating), and a dead
    # rank is noticed at once. The watchdog reports a missing rank sooner (driver/watchdog.py).
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
}

# Other variables every rank gets unless --env / env= says otherwise.
DEFAULT_RANK_ENV = {
    # Keras 2 for `tf.keras` and, on a rank, for `import keras` too (hvd_magic.rank.keras_alias):
    # Horovod's Keras wrappers need it, and HorovodRunner-era code is written for it.
    "TF_USE_LEGACY_KERAS": "1",
    # TensorFlow's C++ INFO/WARNING lines (oneDNN, cudart) on every rank drown the user's output.
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def new_run_id():
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


class Run:
    """One launch of a function on N ranks. `results` are in rank order; `value` is rank 0's."""

    def __init__(self, np, run_dir=None, launcher=None, view=None, timeout=None, cell=None,
                 horovod_env=None, extra_env=None, broadcast_bytes=DEFAULT_BROADCAST_BYTES,
                 allow_retry=False, name=None, timeline=False, stall_timeout=DEFAULT_STALL_TIMEOUT,
                 on_stall="warn", run_root="hvd_runs", tensorboard=None):
        self.id = new_run_id()
        self.np = np
        self.name = name
        self.run_dir = os.path.abspath(run_dir or os.path.join(run_root, self.id))
        self.folder = RunFolder(self.run_dir)
        self.launcher = launcher
        self.view = view
        self.timeout = timeout
        self.cell = cell
        self.horovod_env = {**DEFAULT_HOROVOD_ENV, **(horovod_env or {})}
        self.extra_env = {**DEFAULT_RANK_ENV, **(extra_env or {})}
        self.broadcast_bytes = broadcast_bytes
        self.allow_retry = allow_retry
        self.timeline = timeline
        self.tensorboard = tensorboard  # where the ranks' TensorBoard logs go (default: run folder)
        self.stall_timeout = stall_timeout
        self.on_stall = on_stall
        self.state = "pending"
        self.ranks = [RankState(r) for r in range(np)]
        self.results = None
        self.exports = {}
        self.error = None
        self.where = None
        self.started = None
        self.ended = None
        self.background = False
        self.rejected_frames = 0
        self.rejected_events = 0     # authenticated events that made no sense
        self.broadcast_names = []    # values that travelled by broadcast
        self.timeline_path = None    # run_dir/timeline.json once rank 0's timeline came back
        self.stall = None            # the watchdog's message, once it fired
        self.failures = []           # exit events of failed ranks, in arrival order
        self.retry = None            # set when Spark re-attempted the stage (and we refused)
        self.stop_reason = None
        self._done = threading.Event()
        self._server = None
        self._driver = Driver(self)
        self._thread = None

    # -- public -------------------------------------------------------------------------------
    @property
    def value(self):
        """Rank 0's value."""
        return self.results[0] if self.results else None

    @property
    def elapsed(self):
        if self.started is None:
            return 0.0
        return (self.ended or time.time()) - self.started

    @property
    def tensorboard_dir(self):
        """The folder holding each rank's TensorBoard logs (rank-<k>/), once they came back."""
        return self.folder.tensorboard

    @property
    def files(self):
        """kind -> path of each file the ranks sent back (e.g. the timeline)."""
        return self.folder.files

    def log_path(self, rank):
        return self.folder.log_path(rank)

    @property
    def metrics(self):
        """Every metric the ranks reported (`hvd_magic.report`, framework callbacks), as a
        pandas DataFrame with one row per value: rank, step, name, value."""
        import pandas as pd

        rows = [(r.rank, step, name, value) for r in self.ranks for step, values in r.history
                for name, value in values.items()]
        return pd.DataFrame(rows, columns=["rank", "step", "name", "value"])

    def wait(self, timeout=None):
        """Wait for a background run to end; raise its error, or return its results."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"run {self.id} is still {self.state} after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.results

    def cancel(self):
        """Stop every rank (as a kernel interrupt would); the run ends 'cancelled'."""
        self._driver.request_stop("cancelled")

    def unended(self):
        """Ranks that started and did not report their end."""
        return [r for r in self.ranks if r.pid is not None and r.exit is None]

    def __repr__(self):
        return f"<Run {self.id} np={self.np} {self.state}>"

    # -- launching ----------------------------------------------------------------------------
    def launch(self, job, kwargs_pickled, background=False):
        """Start the ranks. `job` is {"fn", "args", "sources", ...} with args already pickled."""
        self.launcher.prepare(self.np)
        self.folder.create(self.np)
        self.where = self.launcher.where
        small = {n: d for n, d in kwargs_pickled.items() if len(d) <= self.broadcast_bytes}
        # Large values travel once per executor, not inside every task; the pickled bytes are
        # dropped here as soon as they are shared, to spare driver memory.
        shared = {}
        for name in [n for n in kwargs_pickled if n not in small]:
            shared[name] = self.launcher.share(kwargs_pickled.pop(name))
        self.broadcast_names = sorted(shared)
        job = dict(job, kwargs=small)
        self._server = self.launcher.open_channel()
        settings = TaskSettings(
            run_id=self.id, np=self.np,
            events_address=f"{self.launcher.driver_host}:{self._server.port}",
            token=self._server.token, job=pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL),
            horovod_env=self.horovod_env, cwd=os.getcwd(), allow_retry=self.allow_retry,
            broadcast_kwargs=shared, extra_env=self.extra_env, timeline=self.timeline)
        self.started = time.time()
        self.state = "running"
        self.background = background  # a view shows a background run at once (its cell ends now)
        self.write_meta()
        history.add(self)
        if self.view is not None:
            self.view.start(self)
        self.launcher.start(settings, self.np)
        if background:
            self._thread = threading.Thread(target=self._drive_quietly,
                                            name=f"hvd-magic-run-{self.id}", daemon=True)
            self._thread.start()
            return self
        self._driver.drive()
        return self

    def _drive_quietly(self):
        try:
            self._driver.drive()
        except BaseException:  # kept on the run; raised by wait()
            pass

    def write_meta(self):
        self.folder.write_meta({
            "id": self.id, "np": self.np, "state": self.state, "where": self.where,
            "started": self.started, "ended": self.ended, "name": self.name,
            "ranks": [r.as_dict() for r in self.ranks]})
