"""``--timeline`` on a JAX rank: JAX's profiler over the window `hvd_magic.rank.profile` counts
(a step is a ``hvd_magic.report(step=...)``: JAX has no optimizer or fit of its own to count),
its trace read back as the events torch's profile holds, so that the driver merges, aligns and
reads every framework's ranks alike (`hvd_magic.timelines.ranks`).

- `Recorder`: ``jax.profiler.start_trace`` / ``stop_trace`` in the rank's profile folder; JAX
  writes its XSpace there (``plugins/profile/<run>/<host>.xplane.pb``), kept as it is within the
  size budget (TensorBoard's profile plugin and XProf open the run folder's
  ``profile/rank-<k>``). Python's own calls are traced only with ``--timeline-detail stacks``
  (JAX traces every Python call by default: 20 000 events for a few jitted steps).
- `events_of`: the XSpace, read with JAX's public ``jax.profiler.ProfileData`` (no TensorFlow
  needed), as Chrome trace events in microseconds of the rank's wall clock: JAX's Perfetto file
  (``create_perfetto_trace``) holds the same events but its times count from the profile's start,
  which only the XSpace says. An XLA op that is a collective (an ``all-reduce``, a ``psum`` of
  ``shard_map``...) is ``cat: jax_collective`` and keeps its whole span, as torch's Gloo events.

Imports JAX only where the window starts, in a rank whose job imports it.
"""

import os
import re

from . import tf_profile

# XLA's collective ops and the JAX primitives shard_map and pmap lower to under their own names
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "psum", "pmax", "pmin", "pmean", "all_gather",
               "all_to_all", "ppermute", "psum_scatter", "reduce_scatter", "pbroadcast")
_SUFFIX = re.compile(r"(\.\d+)+$")


def collective_kind(op):
    """The collective an XLA op's name says it is ("all-reduce.3" -> "all-reduce",
    "psum_invariant.7" -> "psum"), or None."""
    base = _SUFFIX.sub("", op)
    for kind in COLLECTIVES:
        if base == kind or base.startswith(kind + "_") or base.startswith(kind + "-"):
            return kind
    return None


class Recorder(tf_profile.Recorder):
    """JAX's profiler over the window, in `folder` (its XSpace kept there if it is at most
    `budget` bytes; read as TensorFlow's is, by `events_of` below)."""

    @staticmethod
    def read(path):
        return events_of(path)

    def start(self):
        import jax.profiler
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 1 if "stacks" in self.detail else 0
        jax.profiler.start_trace(self.folder, profiler_options=options)

    def stop(self):
        import jax.profiler
        jax.profiler.stop_trace()  # (stops and writes the XSpace: JAX has no stop alone)


def events_of(path):
    """The XSpace at `path` as Chrome trace events: a thread (track) per line of its host and
    device planes, times in microseconds of the wall clock."""
    import jax.profiler
    space = jax.profiler.ProfileData.from_file(path)
    start_ns = _start_ns(space)
    events, pid = [], os.getpid()
    planes = [p for p in space.planes if p.name.startswith(("/host:", "/device:"))
              and p.name != "/host:metadata"]
    for index, plane in enumerate(planes):
        for number, line in enumerate(plane.lines):
            tid = index * 1_000_000 + number
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"{line.name} ({plane.name})"}})
            for event in line.events:
                if event.duration_ns <= 0 or event.name.startswith("end: "):
                    continue  # (marks: a thread pool's regions, an op's completion)
                stats = dict(event.stats)
                op = stats.get("hlo_op")
                kind = collective_kind(op) if isinstance(op, str) else None
                name = f"{op}:{kind}" if kind else event.name
                cat = "jax_collective" if kind else "jax_op" if op else "jax"
                begin = event.start_ns + (start_ns if event.start_ns < 10 ** 17 else 0)
                record = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                          "ts": round(begin / 1000, 3), "dur": round(event.duration_ns / 1000, 3)}
                if op:
                    record["args"] = {"hlo_module": str(stats.get("hlo_module", ""))}
                events.append(record)
    return events


def _start_ns(space):
    """When the profile began (ns of the wall clock): its events' times count from it."""
    for plane in space.planes:
        for name, value in plane.stats:
            if name == "profile_start_time" and isinstance(value, int):
                return value
    return 0
