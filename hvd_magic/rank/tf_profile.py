"""``--timeline`` on a TensorFlow rank (tf.distribute, Keras, a custom loop) that runs no
Horovod: TensorFlow's profiler over the window `hvd_magic.rank.profile` counts, its trace read
back as the events torch's profile holds, so that the driver merges, aligns and reads every
framework's ranks alike (`hvd_magic.timelines.ranks`).

- steps: a Keras training batch (any ``fit``, Keras 2 or 3: counted where the batch's callbacks
  end, nothing added to the user's callbacks); in a loop without ``fit``, each
  ``hvd_magic.report(step=...)``;
- `Recorder`: TensorFlow's profiler started and stopped in the rank's profile folder; TensorFlow
  writes its XSpace there (``plugins/profile/<run>/<host>.xplane.pb``), which is kept as it is
  within the size budget: TensorBoard's profile plugin opens the run folder's
  ``profile/rank-<k>``;
- `events_of`: an XSpace's host threads (and devices) as Chrome trace events, in microseconds of
  the rank's wall clock; a collective (``CollectiveReduceV2``...) keeps its whole span, from its
  start to the last rank's arrival, as torch's Gloo events do.

Reads TensorFlow's own copy of the XSpace message (`compat.tensorflow`); imports nothing before
the job's TensorFlow is loaded.
"""

import glob
import os

from . import hooks
from ..compat import tensorflow as tf_compat

COLLECTIVE_TYPES = ("Collective", "NcclAllReduce", "NcclReduce", "NcclBroadcast")


def count_keras_batches(batch_ended):
    """Call `batch_ended()` after each Keras training batch, once Keras loads (Keras 3's
    callback list and Keras 2's: a rank's ``import keras`` may be either)."""
    def patch(module):
        callbacks = getattr(module, "CallbackList", None)
        if callbacks is None or getattr(callbacks, "_hvd_magic_counted", False):
            return
        original = callbacks.on_train_batch_end

        def on_train_batch_end(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            batch_ended()
            return result

        callbacks.on_train_batch_end = on_train_batch_end
        callbacks._hvd_magic_counted = True

    for package, internal in tf_compat.KERAS_CALLBACK_LISTS.items():
        hooks.when_imported(package, tf_compat.check_modules)
        hooks.when_imported(internal, patch)


class Recorder:
    """TensorFlow's profiler over the window, in `folder` (its XSpace kept there if it is at
    most `budget` bytes)."""

    def __init__(self, detail, folder, budget):
        self.detail, self.folder, self.budget = detail, folder, budget

    @staticmethod
    def read(path):
        return events_of(path)

    def start(self):
        import tensorflow as tf
        options = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=2, device_tracer_level=1,
            python_tracer_level=1 if "stacks" in self.detail else 0)
        tf.profiler.experimental.start(self.folder, options=options)

    def stop(self):
        import tensorflow as tf
        tf.profiler.experimental.stop()

    def events(self):
        """The window's events (and no distributed info: torch's alone has it), read from the
        XSpace TensorFlow wrote (off the step)."""
        spaces = sorted(glob.glob(os.path.join(self.folder, "plugins", "profile", "*",
                                               "*.xplane.pb")), key=os.path.getmtime)
        events = self.read(spaces[-1]) if spaces else []
        for path in spaces:
            if os.path.getsize(path) > self.budget:
                os.remove(path)  # (its events are in the trace, within the budget)
        return events, None


def is_collective(name):
    """Whether a TensorFlow event's name ("<op name>:<op type>") is a collective op's."""
    if "::" in name or ":" not in name:
        return False
    return name.rpartition(":")[2].startswith(COLLECTIVE_TYPES)


def events_of(path):
    """The XSpace at `path` as Chrome trace events: a thread (track) per line of its host and
    device planes, times in microseconds of the wall clock; none where this TensorFlow has no
    XSpace message we know."""
    space = tf_compat.xspace()
    if space is None:
        return []
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    start_ns = _start_ns(space)
    events, pid = [], os.getpid()
    planes = [p for p in space.planes if p.name.startswith(("/host:", "/device:"))]
    for index, plane in enumerate(planes):
        for line in plane.lines:
            tid = index * 1_000_000 + line.id
            base_ns = line.timestamp_ns + (start_ns if line.timestamp_ns < 10 ** 17 else 0)
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"{line.display_name or line.name} "
                                            f"({plane.name})"}})
            for event in line.events:
                if event.duration_ps <= 0:
                    continue  # (marks of the thread pool's regions)
                name = plane.event_metadata[event.metadata_id].name
                cat = ("tf_collective" if is_collective(name)
                       else "tf_op" if ":" in name and "::" not in name else "tf")
                events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                               "ts": round(base_ns / 1000 + event.offset_ps / 1e6, 3),
                               "dur": round(event.duration_ps / 1e6, 3)})
    return events


def _start_ns(space):
    """When the profile began (ns of the wall clock): its lines' times count from it."""
    for plane in space.planes:
        for stat in plane.stats:
            if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                return stat.uint64_value or stat.int64_value
    return 0
