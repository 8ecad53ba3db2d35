"""`Run`: one launch of a function on N ranks, and the user's handle on it.

A run, from the driver's side:
1. `launch` opens an `EventServer` for the run, ships large values once per executor
   (`Launcher.share`), and asks the launcher to start the tasks;
2. the driver loop (`hvd_magic.driver.loop`) turns the tasks' events into per-rank state, full
   logs in the run folder and view updates, stops every rank as soon as one fails (or on
   interrupt / timeout);
3. at the end `hvd_magic.driver.ending` gathers the ranks' values in rank order, or the error.
"""

import contextlib
import datetime
import os
import pickle
import secrets
import signal
import threading
import time

from .. import frameworks, payload
from ..capture.modules import identifiers, names_in_pickle
from ..errors import RunCancelled
from ..config import RunOptions
from ..task.settings import TaskSettings
from . import history
from .folder import RunFolder
from .loop import Driver
from .membership import Membership
from .debugger import Debugging
from .stacks import StackRequests
from .shown import ShownValue
from .usage import Tables
from ..words import plural
from .ranks import RankState

OFFLINE_HINT_AFTER = 10.0    # seconds without a Spark Connect task heard before the view says so
TASKS_WAIT_SHOWN_AFTER = 3.0  # seconds without a task started before the view says it waits
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
TIMELINE_HOROVOD_ENV = {"HOROVOD_CACHE_CAPACITY": "0"}

WINDOW_NAMES = frozenset({"timeline", "start_timeline"})  # see may_record_window

# Other variables every rank gets unless --env / env= says otherwise.
DEFAULT_RANK_ENV = {
    # Keras 2 for `tf.keras` and, on a rank, for `import keras` too (hvd_magic.rank.keras_alias):
    # Horovod's Keras wrappers need it, and HorovodRunner-era code is written for it.
    "TF_USE_LEGACY_KERAS": "1",
    # TensorFlow's C++ INFO/WARNING lines (oneDNN, cudart) on every rank drown the user's output.
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def may_record_window(job):
    """Whether the job may record a timeline window: its code uses the name `timeline` or
    `start_timeline` (`hvd_magic.timeline()`, `hvd.start_timeline()`), in its pickled function or
    arguments, its cell or the notebook modules it ships. Words in strings and comments do not
    count (a docstring that mentions timelines is not a window).

    Only then do its ranks get HOROVOD_TIMELINE=DYNAMIC: with a timeline configured, even one
    never started, Horovod's controller syncs timeline state with the response cache every
    cycle (and rank 0's writer thread wakes every ms), which cost rank 0 ~25% more CPU per
    training step at np 4 on 2 cores (bench/bench_training.py, `:notl`). A window asked for anyway says how to get one
    (timelines/record.py)."""
    blobs = [job.get("fn") or b"", *job.get("args", ()), *job.get("kwargs", {}).values()]
    if any(WINDOW_NAMES & names_in_pickle(blob) for blob in blobs
           if isinstance(blob, (bytes, bytearray))):
        return True
    texts = [*(job.get("sources") or {}).values(), *(job.get("modules") or {}).values()]
    return any(WINDOW_NAMES & identifiers(text) for text in texts)


@contextlib.contextmanager
def interruptible():
    """While a run is launched and driven from the main thread: an interrupt (the notebook's
    Interrupt, Ctrl-C) raises KeyboardInterrupt there, and so cancels the run, whatever a library
    left as SIGINT's handler. Lightning's Trainer leaves it ignored after a KeyboardInterrupt
    (and its ``_destroy_dist_connection`` at the default, which would end the kernel). The
    handler is put back after."""
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or \
            before not in (signal.SIG_IGN, signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _data_plan(run):
    """The --data plan the ranks read their rows by (None without --data); its shards told."""
    from ..data.plan import describe, equalize

    plan = getattr(run.launcher, "data", None)
    if plan is None:
        return None
    total = sum(plan["counts"])
    if run.equal_shards:
        plan = equalize(plan)
    run.shards = list(plan["counts"])
    if run.view is not None:
        run.view.event(run, None, {"t": "shards", "message": describe(plan, total)})
    return plan


def _relay_notes(run):
    """The launcher's new notes (`Launcher.take_notes`) to the run's view."""
    for note in run.launcher.take_notes():
        if run.view is not None:
            run.view.event(run, None, {"t": "note", "message": note})


def _prepare_into(launcher, np, failure, done, data=None, cache=None):
    try:
        launcher.prepare(np)
        if data is not None:
            launcher.use_data(data, np, cache)  # UsageError for a DataFrame the ranks cannot get
    except BaseException as exc:  # raised in the caller's thread by Run._prepare
        failure.append(exc)
    finally:
        done.set()


def new_run_id():
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


class Run(StackRequests, Debugging, ShownValue, Tables):
    """One launch of a function on N ranks. `results` are in rank order; `value` is rank 0's."""

    def __init__(self, np, options=None, *, launcher=None, view=None, cell=None, env=None,
                 elastic=None, frozen_timeout=None, profile=None):
        """`np` rows (ranks, or an elastic run's slots); `env`: `options.env` with what MLflow
        adds; `elastic`: the placement's (min_np, max_np, timeout), `frozen_timeout` its
        ``--frozen-timeout``; `profile`: what torch's profiler records on every rank
        (`hvd_magic.api.profile_plan`)."""
        self.options = options = options if options is not None else RunOptions()
        self.id = new_run_id()
        self.np = np
        self.name = options.name
        self.run_dir = os.path.abspath(options.run_dir or os.path.join(options.run_root, self.id))
        self.folder = RunFolder(self.run_dir)
        self.launcher = launcher
        self.view = view
        self.timeout = options.timeout
        self.cell = cell
        # (a --timeline run records which rank each collective waited on: Horovod's response
        # cache would skip the ranks' readiness for every collective seen before)
        self.horovod_env = {**DEFAULT_HOROVOD_ENV, **(TIMELINE_HOROVOD_ENV if options.timeline
                                                       else {}), **options.horovod_env}
        self.extra_env = {**DEFAULT_RANK_ENV, **(options.env if env is None else env)}
        self.broadcast_bytes = options.broadcast_bytes
        self.allow_retry = options.retries > 0
        self.timeline = options.timeline
        self.profile = profile       # --timeline without Horovod (api.profile_plan)
        self.tensorboard = options.tensorboard  # the ranks' TensorBoard logs (default: run folder)
        self.stall_timeout = options.stall_timeout
        self.on_stall = options.on_stall
        self.state = "pending"
        self.ranks = [RankState(r) for r in range(np)]
        self.results = None
        self.exports = {}
        self.error = self.where = None
        self.started = None          # when the ranks were launched (after prepare)
        self.preparing_since = None  # when the launcher began to prepare
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
        self.data = options.data     # a Spark DataFrame whose rows the ranks get (--data)
        self.equal_shards = options.equal_shards
        self.data_cache = options.data_cache  # where a DataFrame not plain Parquet is converted
        self.shards = None           # rows per rank's shard (--data), once planned
        # an elastic run's members and every change to them (min_np, max_np, timeout given)
        self.elastic = Membership(np, *elastic, frozen_timeout=frozen_timeout) \
            if elastic is not None else None
        self._done = threading.Event()
        self._server, self.gathering = None, frameworks.Gathering(np)  # (the tasks' rendezvous)
        self._shared = {}
        self._driver = Driver(self)
        self._thread = None

    # -- public -------------------------------------------------------------------------------
    @property
    def value(self):
        """Rank 0's value."""
        return self.results[0] if self.results else None

    @property
    def elapsed(self):
        begun = self.started or self.preparing_since
        if begun is None:
            return 0.0
        return (self.ended or time.time()) - begun

    @property
    def tensorboard_dir(self):
        """The folder holding each rank's TensorBoard logs (rank-<k>/), once they came back."""
        return self.folder.tensorboard

    @property
    def files(self):
        """kind -> path of each file the ranks sent back (e.g. the timeline)."""
        return self.folder.files

    @property
    def membership(self):
        """An elastic run's membership changes (ranks lost and joined, each ring formed), in
        order; [] for other runs."""
        return list(self.elastic.changes) if self.elastic is not None else []

    def log_path(self, rank, readable=False):
        """Rank `rank`'s full log: every byte it printed, or `readable` (as a person reads it:
        no terminal codes, no C++ start-up chatter)."""
        return self.folder.log_path(rank, readable)

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

    def expire(self):
        """Its ``--timeout`` is over now: what the driver loop does at the deadline (every rank
        stopped, the run ends 'timeout' with `RunTimeout`), at a moment the caller chose."""
        self._driver.request_stop("timeout")

    def announce(self, message):
        """Send `message` to every task of the run, now or later (`hvd_magic.sweeps.trial`)."""
        if self._server is not None:
            self._server.announce(message)

    def unended(self):
        """Ranks that started and did not report their end."""
        return [r for r in self.ranks if r.pid is not None and r.exit is None]

    def __repr__(self):
        return f"<Run {self.id} np={self.np} {self.state}>"

    # -- launching ----------------------------------------------------------------------------
    @interruptible()  # (an interrupt cancels the run, whatever SIGINT's handler)
    def launch(self, job, kwargs_pickled, background=False):
        """Start the ranks. `job` is {"fn", "args", "sources", ...} with args already pickled."""
        self.background = background  # a view shows a background run at once (its cell ends now)
        self._prepare()
        self.data = None  # the launcher holds its plan now
        plan = _data_plan(self)
        self.folder.create(self.np)
        small = {n: payload.inband(d) for n, d in kwargs_pickled.items()
                 if len(d) <= self.broadcast_bytes}
        # large values go once per executor, not in every task; their bytes dropped once shared
        shared = {}
        for name in [n for n in kwargs_pickled if n not in small]:
            shared[name] = self.launcher.share(kwargs_pickled.pop(name))
        self.broadcast_names = sorted(shared)
        self._shared = shared  # released when the run ends (driver/loop.py)
        job = dict(job, kwargs=small, data=plan)
        self._server = self.launcher.open_channel()
        settings = TaskSettings(
            run_id=self.id, np=self.np, fork=not self.options.fresh,  # (hvd_magic.template)
            events_address=f"{self.launcher.driver_host}:{self._server.port}",
            token=self._server.token, job=pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL),
            horovod_env=self.horovod_env, cwd=os.getcwd(), allow_retry=self.allow_retry,
            broadcast_kwargs=shared, extra_env=self.extra_env,
            timeline=self.timeline and not self.profile, profile=self.profile,
            timeline_window=may_record_window(job), executor_cores=self.launcher.executor_cores,
            shipment=tuple(self.launcher.shipment))
        self.started = time.time()
        self.state = "running"
        self.folder.write_meta(self)
        history.add(self)
        if self.elastic is not None:
            self.elastic.log_horovod(self.run_dir)  # until the driver loop ends (loop.py)
        self.launcher.start(settings, self.np)
        if background:
            self._thread = threading.Thread(target=self._drive_quietly,
                                            name=f"hvd-magic-run-{self.id}", daemon=True)
            self._thread.start()
            return self
        self._driver.drive()
        return self

    def _prepare(self):
        """`launcher.prepare` in a helper thread, while the view (shown first) says what it waits
        on and a Cancel click or an interrupt can stop it (`launcher.cancel`)."""
        self.state = "preparing"
        self.preparing_since = time.time()
        if self.view is not None:
            self.view.start(self)
        failure, prepared = [], threading.Event()
        thread = threading.Thread(target=_prepare_into,
                                  args=(self.launcher, self.np, failure, prepared, self.data,
                                        self.data_cache),
                                  name=f"hvd-magic-prepare-{self.id}", daemon=True)
        thread.start()
        cancel_sent = False
        # (an Event, not thread.is_alive(): an interrupt landing in Thread.join can leave
        # is_alive() False while the thread still runs, and the cancel unsent)
        while not prepared.is_set():
            try:  # an interrupt lands anywhere in here (showing the dashboard, say)
                prepared.wait(0.1)
                if self.stop_reason is not None and not cancel_sent:
                    cancel_sent = True
                    self.launcher.cancel()
                _relay_notes(self)
                if self.view is not None:
                    self.view.tick(self)
            except KeyboardInterrupt:
                self.stop_reason = self.stop_reason or "cancelled"
        if failure or self.stop_reason is not None:
            error = failure[0] if failure else RunCancelled(
                f"run {self.id} was cancelled before its ranks started.")
            self.state = "cancelled" if isinstance(error, RunCancelled) else "failed"
            self.error, self.ended = error, time.time()
            if self.state == "cancelled":
                history.add(self)  # `last_run()` says it was cancelled
            self._done.set()
            self.show_end()
            if self.view is not None:
                self.view.finish(self)
            raise error
        _relay_notes(self)
        self.where = self.launcher.where

    @property
    def waiting(self):
        """(what the run waits on before its ranks start, seconds so far), or None: the launcher's
        phase while it prepares, then Spark's scheduling of the tasks if none has begun a while
        after the launch (a barrier stage waits until every slot it needs is free)."""
        if self.state == "preparing":
            phase = getattr(self.launcher, "phase", None)
            return (phase, time.monotonic() - self.launcher.phase_since) if phase else None
        if self.state != "running" or self.stop_reason is not None:
            return None
        seconds = time.time() - self.started
        if seconds < TASKS_WAIT_SHOWN_AFTER or any(r.state != "pending" for r in self.ranks):
            return None
        if self.where == "driver only":
            why = ("" if self.options.fresh else ": this machine's rank template is loading what "
                   "the cell imports, once a kernel")
            return "waiting for the ranks to start" + why, seconds
        if getattr(self.launcher, "offline_possible", False) and seconds > OFFLINE_HINT_AFTER:
            return (f"waiting for the tasks on {self.where}: none has reached this notebook "
                    f"(if the executors cannot, the run goes on and its logs come back at the "
                    f"end)", seconds)
        return f"waiting for Spark ({self.where}) to start {plural(self.np, 'task')} at once", seconds

    def _drive_quietly(self):
        try:
            self._driver.drive()
        except BaseException:  # kept on the run; raised by wait()
            pass
