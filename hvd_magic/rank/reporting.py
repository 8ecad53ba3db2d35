"""What a rank tells the driver besides its printed lines: progress, metrics, state.

`report(step=..., total=..., **metrics)` is public (``hvd_magic.report``); any tqdm bar in a rank
calls it too, through a hook installed by the rank bootstrap. Outside a rank both do nothing, so
the same cell also runs as plain notebook code.

Events are JSON lines written to the pipe named by ``HVD_MAGIC_EVENT_FD``; the task forwards them.
Calls are throttled here (at most one progress event per `MIN_INTERVAL` seconds per rank, plus the
last one) so that calling `report` on every training step costs a time check, not a syscall. A
framework's own step count (DeepSpeed's ``engine.step()``), which carries no metric, goes at most
every `STEP_INTERVAL`: each event wakes the task's, the event server's and the driver's threads,
which share the ranks' cores. The latest event held back is sent by one sender thread of the
rank, which sleeps until it is due (a thread per interval cost a thread start ten times a
second, and the step that started it waited for it to run).
"""

import json
import os
import sys
import threading
import time

from . import hooks, profile, trial

MIN_INTERVAL = 0.1
STEP_INTERVAL = 0.25    # a framework's step count alone: the progress, four times a second
MAX_POINTS = 10_000     # metric points that make an event go at once (a tight loop's points)


class _Channel:
    """This rank's side of the event pipe, with the progress throttle (one per process)."""

    def __init__(self):
        # re-entrant: an event is chosen and written under it, so two threads (the caller's and
        # the sender's) never write an older progress after a newer one
        self.lock = threading.RLock()
        self.due = threading.Condition(self.lock)  # `send_at` set or cleared
        self.fd = None
        self.last_sent = 0.0
        self.last_event = None
        self.pending = None     # the latest throttled progress event, not sent yet
        self.send_at = None     # when the sender sends `pending`
        self.sender = None      # the thread that does, started by the first event held back
        self.points = []        # every [step, metrics] reported since the last event
        self.calls = 0          # x of a point reported without a step

    def event_fd(self):
        if self.fd is None:
            value = os.environ.get("HVD_MAGIC_EVENT_FD")
            self.fd = int(value) if value else -1
        return self.fd

    def write(self, event):
        if self.event_fd() < 0:
            return
        data = (json.dumps(event, default=str, separators=(",", ":")) + "\n").encode()
        with self.lock:  # one event at a time, whole: a big one is not atomic on a pipe
            try:
                view = memoryview(data)
                while view:  # a signal (the driver's interrupt) can cut a large write short
                    view = view[os.write(self.fd, view):]
            except OSError:
                pass

    def progress(self, event, interval=MIN_INTERVAL):
        now = time.monotonic()
        with self.lock:
            repeated = self.pending is None and event == self.last_event
            if repeated and event["step"] is not None:
                return  # nothing new (tqdm's close repeats its last update)
            if event["metrics"]:  # every point is kept for the charts, not only the latest
                self.calls += 1
                self.points.append([self.calls if event["step"] is None else event["step"],
                                    event["metrics"]])
            # (a repeated value without a step is a new point: it goes, not kept back unsent)
            final = (event["step"] is not None and event["total"] is not None
                     and event["step"] >= event["total"]) or len(self.points) >= MAX_POINTS
            if not final and (self.send_at is not None or now - self.last_sent < interval):
                # Keep the latest; the sender sends it when the interval is over, so a rank that
                # then computes for minutes without reporting still shows where it is.
                self.pending = event
                if self.send_at is None:
                    self.send_at = self.last_sent + interval
                    self._wake_sender()
                return
            self.pending = self.send_at = None
            self.last_sent, self.last_event = now, event
            self.write(self._with_points(event))

    def _wake_sender(self):
        # (a rank forked from the template has no thread of its parent's: started here, once)
        if self.sender is None or not self.sender.is_alive():
            self.sender = threading.Thread(target=self._send_when_due, name="hvd-magic-progress",
                                           daemon=True)
            self.sender.start()
        else:
            self.due.notify()

    def _send_when_due(self):
        with self.lock:
            while True:
                if self.send_at is None:
                    self.due.wait()
                elif time.monotonic() < self.send_at:
                    self.due.wait(self.send_at - time.monotonic())
                else:
                    self.flush()

    def _with_points(self, event):
        if not self.points:
            return event
        points, self.points = self.points, []
        return dict(event, points=points)

    def flush(self):
        with self.lock:
            event, self.pending, self.send_at = self.pending, None, None
            if event is not None:
                self.last_sent, self.last_event = time.monotonic(), event
                self.write(self._with_points(event))


_channel = _Channel()


def send(event):
    """Send one event to the driver as it is (no throttle); nothing outside a rank."""
    _channel.write(event)


def state(name, **info):
    """Tell the driver this rank entered a new state (running, done...)."""
    flush()
    _channel.write({"t": "state", "state": name, **info})


def fresh():
    """Whether this rank is an interpreter of its own (``python -m hvd_magic.rank``), not forked
    from a template (`hvd_magic.template`): a fork still has the template's command line. Said
    with the rank's first state, which the run's events.jsonl keeps."""
    return "hvd_magic.template.server" not in sys.orig_argv


def report(step=None, total=None, **metrics):
    """Report progress and metrics of this rank; shown live in the notebook's dashboard, one
    chart per metric with a line per rank (x: `step`, else the number of the call).

    Cheap enough to call on every step: events are sent at most ten times a second, carrying
    every point reported since the last one, and the latest is never lost (it follows within a
    tenth of a second). Metrics are numbers (tensors and numpy scalars are read with
    ``.item()``); all of them are in ``hvd_magic.last_run().metrics`` afterwards.

    Examples
    --------
    >>> for step in range(100):
    ...     loss = train_step()
    ...     hvd_magic.report(step=step + 1, total=100, loss=loss)
    """
    if _channel.event_fd() < 0:
        return
    global _cell_reports_steps
    if step is not None:
        _cell_reports_steps = True
        profile.reported()  # (a step of a loop that --timeline profiles)
    clean = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):  # torch/numpy scalars
            try:
                value = value.item()
            except (ValueError, RuntimeError):
                value = str(value)
        clean[key] = value
    _channel.progress({"t": "progress", "step": step, "total": total, "metrics": clean})
    if step is not None:  # a sweep's early stop: every rank of the trial leaves at one step
        try:
            trial.at_step(step, _flushed_send)
        except trial.TrialStopped:
            flush()
            raise


def _flushed_send(event):
    flush()  # (the points before the step go first)
    send(event)


_cell_reports_steps = False


def framework_step(step):
    """A framework's own step count as the rank's progress (DeepSpeed's ``engine.step()``),
    until the cell reports steps itself: then its own count (and total) stand."""
    if not _cell_reports_steps and _channel.event_fd() >= 0:
        _channel.progress({"t": "progress", "step": step, "total": None, "metrics": {}},
                          STEP_INTERVAL)


def flush():
    """Send the latest throttled progress event, if one is waiting."""
    _channel.flush()


# --- tqdm -------------------------------------------------------------------------------------

def _patch_tqdm(std):
    cls = std.tqdm
    if getattr(cls, "_hvd_magic_patched", False):
        return
    original_update, original_close = cls.update, cls.close

    def update(self, n=1):
        result = original_update(self, n)
        _report_bar(self)
        return result

    def close(self):
        if not getattr(self, "disable", False) and not getattr(self, "_hvd_magic_quiet", False):
            _report_bar(self)
            flush()
        return original_close(self)

    cls.update, cls.close = update, close
    cls._hvd_magic_patched = True


def _report_bar(bar):
    # (_hvd_magic_quiet: a bar class whose progress is reported another way, Lightning's)
    if getattr(bar, "disable", False) or getattr(bar, "_hvd_magic_quiet", False):
        return
    metrics = {}
    postfix = getattr(bar, "postfix", None)
    if postfix:
        metrics["postfix"] = str(postfix).lstrip(", ")
    if getattr(bar, "desc", ""):
        metrics["desc"] = bar.desc
    report(step=bar.n, total=bar.total, **metrics)


def install_tqdm_hook():
    """Any tqdm bar the cell makes drives this rank's progress (patched once tqdm is imported)."""
    hooks.when_imported("tqdm.std", _patch_tqdm)


def tensorboard_dir():
    """This rank's TensorBoard log folder: give it to ``SummaryWriter`` or
    ``keras.callbacks.TensorBoard``. When the rank ends, what it holds comes back to the notebook
    (``<run folder>/tensorboard/rank-<k>/``, or ``--tensorboard DIR``); ``%horovod_tensorboard``
    shows it. Outside a rank: ``hvd_runs/tensorboard``.

    Examples
    --------
    >>> writer = torch.utils.tensorboard.SummaryWriter(hvd_magic.tensorboard_dir())
    """
    path = os.environ.get("HVD_MAGIC_TENSORBOARD_DIR") or os.path.join("hvd_runs", "tensorboard")
    os.makedirs(path, exist_ok=True)
    return path
