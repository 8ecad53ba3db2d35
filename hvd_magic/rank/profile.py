"""``--timeline`` on a rank that runs no Horovod: torch's (or TensorFlow's, or JAX's) profiler
over a few steps.

The driver asks for it in ``HVD_MAGIC_PROFILE`` (JSON: ``framework``, ``skip``, ``steps``,
``detail``, ``budget``, ``path``). With torch, a step is a training step, seen through its
optimizers' steps, whatever wrote the loop (a plain loop, DDP, FSDP, Lightning, accelerate: each
calls ``Optimizer.step``), by torch's global post-step hook, so no line of the cell changes. A
loop of several optimizers (a GAN's two) steps each once a training step, so a step is counted
where a training step's first optimizer steps: the first one ever, or one that already stepped in
the current training step (a new one begun). A GAN's discriminator and generator count one step
together, its bounds the discriminator's steps; a critic stepped five times a generator step
counts five. With TensorFlow, a step is a Keras training batch or a
``hvd_magic.report(step=...)`` (`hvd_magic.rank.tf_profile`); with JAX, a
``hvd_magic.report(step=...)`` (`hvd_magic.rank.jax_profile`). After ``skip`` steps the profiler
starts; ``steps`` steps later it stops, on the step, and a thread of its own exports, trims and
writes the trace to ``path`` (the task sends its folder back) while training goes on, with the
wall-clock time of each step counted (the profiled steps' bounds) and the rank's host.
``detail`` adds what torch's profiler records besides each operator's time: input shapes,
Python stacks, memory. A run that ends (or is stopped) sooner writes what it has, and waits for
a trace being written.

The file keeps the trace events torch exported, their times made absolute (microseconds of the
rank's wall clock), and at most ``budget`` bytes of them: the shortest operator events go first,
and how many went is written in the file. The merging, clocks and reading are the driver's
(`hvd_magic.timelines.ranks`).

Not for: Horovod's timeline (``HOROVOD_TIMELINE``, rank 0's, set by the task).
"""

import json
import os
import socket
import threading
import time

from . import hooks, jax_profile, tf_profile

PLAN = "HVD_MAGIC_PROFILE"
_KEEP = ("user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "cuda_runtime",
         "tf_collective", "jax_collective")


class _Window:
    def __init__(self, plan):
        self.skip, self.steps = int(plan.get("skip", 3)), int(plan.get("steps", 5))
        self.budget, self.path = int(plan.get("budget", 4 << 20)), plan["path"]
        self.framework = plan.get("framework", "torch")
        self.detail = set(plan.get("detail") or ())
        self.count = 0
        self.marks = []          # when each step was counted: the profiled steps' bounds
        self.recorder = None
        self.done = False
        self.keras = False       # a Keras batch was counted: a report is no step then
        self.stepped_now = set()  # the optimizers that stepped in the current training step
        self.writer = None       # the thread that writes the trace, once the window ended
        self.failed = None       # what stopped it, said at the rank's end
        self.optimizer = False   # so was a torch optimizer's step
        self._lock = threading.RLock()  # (the SIGTERM handler may come inside `stepped`)

    def optimizer_stepped(self, optimizer, *_):
        """torch's post-step hook: a training step begins where an optimizer steps again."""
        self.optimizer = True
        with self._lock:
            if id(optimizer) in self.stepped_now:
                self.stepped_now.clear()
            if not self.stepped_now:
                self.stepped()
            self.stepped_now.add(id(optimizer))

    def stepped(self, *_):
        """One more step (a training step's first optimizer step, a Keras batch's end)."""
        with self._lock:
            if self.done:
                return
            self.count += 1
            if self.count == self.skip:
                self._start()
            elif self.recorder is not None:
                self.marks.append(time.time_ns() // 1000)
                if len(self.marks) > self.steps:
                    self._finish()

    def batch_ended(self):
        self.keras = True
        self.stepped()

    def reported(self):
        """``hvd_magic.report(step=...)``: a step of a loop without Keras' fit, or of a torch
        loop that steps no torch optimizer (an optimizer's step counts, once one was seen)."""
        if not self.keras and not self.optimizer:
            self.stepped()

    def _start(self):
        folder = os.path.dirname(self.path)
        recorders = {"tensorflow": tf_profile.Recorder, "jax": jax_profile.Recorder}
        recorder = (recorders[self.framework](self.detail, folder, self.budget)
                    if self.framework in recorders else _TorchRecorder(self.detail, folder))
        try:
            recorder.start()
        except RuntimeError as exc:  # (the job's own profiler runs: only one may at a time)
            self.done = True
            os.write(2, f"hvd_magic: --timeline records nothing on this rank: its profiler "
                        f"could not start ({exc}). A job that runs the profiler itself "
                        f"(jax.profiler.trace, torch.profiler.profile) records its own: drop "
                        f"--timeline.\n".encode())
            self._record({"steps": [], "events": [], "unstarted": str(exc)})
            return
        self.recorder = recorder
        self.marks.append(time.time_ns() // 1000)

    def finish(self):
        """The rank ends: the window so far, and the trace written (waited for)."""
        with self._lock:
            if not self.done and self.recorder is not None:
                self._finish()
            self.done = True
            writer = self.writer
        if writer is not None:
            writer.join()
            if self.failed is not None:
                raise self.failed

    def _finish(self):
        """The window ends: the profiler stops here, on the step; the trace is written by a
        thread (torch's export, reading it back, trimming it to the budget, writing it: a
        second and more of a large window, which the step no longer waits for)."""
        self.done = True
        recorder, self.recorder = self.recorder, None
        recorder.stop()
        self.writer = threading.Thread(target=self._write, args=(recorder, list(self.marks)),
                                       name="hvd-magic-profile", daemon=True)
        self.writer.start()

    def _write(self, recorder, marks):
        try:
            events, distributed = recorder.events()
            events, cut = _within(events, self.budget)
            self._record({"steps": marks, "cut": cut, "events": events,
                          "distributed": distributed})
        except Exception as exc:  # noqa: BLE001  (said by `finish`, the rank's end)
            self.failed = exc

    def _record(self, fields):
        """The rank's profile record, written whole (`unstarted`: why its profiler did not
        start, which the driver says instead of the window's steps)."""
        record = dict({"host": socket.gethostname(), "pid": os.getpid(), "skip": self.skip,
                       "framework": self.framework}, **fields)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".part"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, separators=(",", ":"))
        os.replace(tmp, self.path)


class _TorchRecorder:
    """torch's profiler over the window (what `detail` asks besides each operator's time)."""

    def __init__(self, detail, folder):
        self.detail, self.raw = detail, os.path.join(folder, "torch.json")

    def start(self):
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(activities=activities, record_shapes="shapes" in self.detail,
                                with_stack="stacks" in self.detail,
                                profile_memory="memory" in self.detail)
        self.profiler.start()

    def stop(self):
        self.profiler.stop()

    def events(self):
        """The window's events, and torch's distributed info (its export: off the step)."""
        self.profiler.export_chrome_trace(self.raw)
        with open(self.raw, encoding="utf-8") as f:
            trace = json.load(f)
        os.remove(self.raw)
        return _absolute(trace), trace.get("distributedInfo")


def _absolute(trace):
    """The trace's events, each ``ts`` made microseconds of the wall clock (torch writes them
    from ``baseTimeNanoseconds``)."""
    base = trace.get("baseTimeNanoseconds", 0) / 1000
    events = []
    for event in trace.get("traceEvents", ()):
        if "ts" in event:
            event = dict(event, ts=float(event["ts"]) + base)
        events.append(event)
    return events


def _within(events, budget):
    """`events` in at most `budget` bytes of JSON: the metadata, annotations (steps,
    collectives, module calls) and GPU work are kept; operator events go shortest first.
    (events kept, how many went)."""
    size = len(json.dumps(events, separators=(",", ":")))
    if size <= budget:
        return events, 0
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") not in _KEEP),
                 key=lambda e: e.get("dur", 0))
    gone = set()
    for event in ops:
        if size <= budget:
            break
        gone.add(id(event))
        size -= len(json.dumps(event, separators=(",", ":"))) + 1
    return [e for e in events if id(e) not in gone], len(gone)


_window = None


def install():
    """Count the optimizer steps once torch's optimizers load (nothing imported here)."""
    global _window
    plan = os.environ.get(PLAN)
    if not plan or _window is not None:
        return
    _window = _Window(json.loads(plan))
    os.makedirs(os.path.dirname(_window.path), exist_ok=True)
    if _window.framework == "tensorflow":
        tf_profile.count_keras_batches(_window.batch_ended)
    elif _window.framework != "jax":  # (JAX's steps are the job's reports alone)
        hooks.when_imported("torch.optim.optimizer", _hook)


def _hook(module):
    module.register_optimizer_step_post_hook(_window.optimizer_stepped)


def reported():
    """A ``hvd_magic.report(step=...)`` call (`hvd_magic.rank.reporting`)."""
    if _window is not None:
        _window.reported()


def finish():
    """The rank ends (or is stopped): the window so far, written."""
    if _window is not None:
        try:
            _window.finish()
        except Exception as exc:  # noqa: BLE001  (the run's own outcome matters more)
            os.write(2, f"hvd_magic: the profile could not be written: {exc!r}\n".encode())
