"""What a person asked a run for, parsed and checked once into two small objects:

- `Placement`: where the ranks run and how many (N on Spark, -N on the driver; the session,
  master and conf of Spark; elastic bounds; where Spark's own log goes);
- `RunOptions`: how the run goes (limits, environment, timeline, data, MLflow, its folder).

Every front door (`%%horovod`, `%horovod script.py`, `hvd_magic.run`, `run_script`,
`HorovodRunner`, `hvd-run`, warm sessions) makes them, from its own spelling of the options, and
hands them whole to the API, the driver (`hvd_magic.driver.run.Run`) and the launchers
(`hvd_magic.launch.make_launcher`). Each value is checked where its field is declared, and every
combination that cannot work is refused by `check_together`: once, here, with one message that
names both spellings (``--np`` / ``np=``). Adding an option is one field here and one line in
each front door that offers it.

Not for: parsing a magic's line (`hvd_magic.frontends.options`) or a terminal's arguments.
"""

import dataclasses
import math
import os
from typing import Any, Mapping, Optional

from IPython.core.error import UsageError

DEFAULT_BROADCAST_BYTES = 4 * 1024 * 1024
DEFAULT_STALL_TIMEOUT = 60.0
ON_STALL = ("warn", "fail")
# Ranks forked from a template that has imported the frameworks (`hvd_magic.template`) unless a
# run asks for --fresh; HVD_MAGIC_FRESH=1 (or 0) in the notebook's environment flips the default.
FRESH_BY_DEFAULT = False


def fresh_by_default():
    value = os.environ.get("HVD_MAGIC_FRESH", "").strip().lower()
    return FRESH_BY_DEFAULT if value == "" else value not in ("0", "false", "no", "off")


def check_np(np):
    """`np` itself, or a UsageError: N ranks on Spark, -N on the driver."""
    if isinstance(np, bool) or not isinstance(np, int) or np == 0:
        raise UsageError(f"np must be a non-zero whole number (N ranks on Spark, -N for N ranks on "
                         f"the driver only), not {np!r}.")
    return np


def _seconds(name, value):
    """None (no limit) for None or 0; a positive number; else a UsageError."""
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
            math.isinf(value):
        raise UsageError(f"{name} takes a positive number of seconds (0 or None: no limit), "
                         f"not {value!r}.")
    return value


_TEXT = (str, Optional[str])
_FLAGS = (bool, Optional[bool])


def _typed(options):
    """A UsageError for a field given a value of the wrong kind (a keyword of `hvd_magic.run`
    can be anything): text where text is asked, a dict of names where a mapping is, True or
    False where a flag is. Numbers are checked by the fields themselves."""
    for field in dataclasses.fields(options):
        name, value = field.name, getattr(options, field.name)
        if value is None and field.type not in (str, bool):
            continue
        if field.type in _TEXT and not isinstance(value, (str, os.PathLike)):
            raise UsageError(f"{name} takes text (a name, an address or a path), not {value!r}.")
        if field.type in _FLAGS and not isinstance(value, bool):
            raise UsageError(f"{name} takes True or False, not {value!r}.")
        if field.type == Mapping[str, str] and not (
                isinstance(value, Mapping) and all(isinstance(k, str) for k in value)):
            raise UsageError(f"{name} takes a dict of names to values, e.g. {{'A': '1'}}, not "
                             f"{value!r}.")


def _shipped(ship):
    """`--ship`: None (what the job imports), () ("none": hvd_magic alone), or the names of
    the distributions to ship ("a,b" or a list)."""
    if ship is None:
        return None
    names = ship.split(",") if isinstance(ship, str) else ship
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise UsageError(f"ship takes the names of distributions ('mylib,other' or a list), or "
                         f"'none', not {ship!r}.")
    names = tuple(n.strip() for n in names if n.strip())
    return () if names in ((), ("none",)) else names


def _set(frozen, **values):
    """Normalise fields of a frozen dataclass in its __post_init__."""
    for name, value in values.items():
        object.__setattr__(frozen, name, value)


def _whole(name, value, least):
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be a whole number >= {least}, not {value!r}.")
    return value


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the ranks run and how many. `np` > 0: N ranks as Spark tasks (the active
    SparkSession, `spark`, or an embedded one at `master`); `np` < 0: -N processes of this
    machine. `min_np` makes the run elastic (`max_np` defaults to the ranks asked for)."""

    np: int = 2
    spark: Any = None
    master: Optional[str] = None
    spark_conf: Mapping[str, str] = dataclasses.field(default_factory=dict)
    min_np: Optional[int] = None
    max_np: Optional[int] = None
    elastic_timeout: Optional[float] = None
    restart_from_scratch: bool = False  # every rank lost: replacements start over from step 0
    frozen_timeout: Optional[float] = None  # None: driver/frozen.py's DEFAULT_TIMEOUT
    log_dir: str = "hvd_runs"       # a Spark JVM started for the run writes its log here
    verbose: bool = False           # ... and to the cell's stderr too

    def __post_init__(self):
        check_np(self.np)
        _typed(self)
        _set(self, spark_conf=dict(self.spark_conf or {}))
        if self.min_np is None:
            if self.max_np is not None or self.elastic_timeout is not None or \
                    self.restart_from_scratch or self.frozen_timeout is not None:
                raise UsageError("--max-np, --elastic-timeout and --frozen-timeout belong to an "
                                 "elastic run (so does --restart-from-scratch): add --min-np M "
                                 "(the fewest ranks the run may go on with).")
            return
        _set(self, max_np=self.ranks if self.max_np is None else self.max_np)
        for name, value in (("min_np", self.min_np), ("max_np", self.max_np)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be a whole number of ranks >= 1, not {value!r}.")
        if not self.min_np <= self.ranks <= self.max_np:
            raise UsageError(f"an elastic run needs min_np <= ranks <= max_np; got min_np "
                             f"{self.min_np}, {self.ranks} ranks, max_np {self.max_np}.")
        for name in ("elastic_timeout", "frozen_timeout"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, (int, float)) or value <= 0):
                raise UsageError(f"{name} takes a positive number of seconds, not {value!r}.")

    @property
    def ranks(self):
        return abs(self.np)

    @property
    def on_driver(self):
        return self.np < 0

    @property
    def elastic(self):
        """(min_np, max_np, timeout) of an elastic run, else None."""
        return None if self.min_np is None else (self.min_np, self.max_np, self.elastic_timeout)

    @property
    def rows(self):
        """The rows a view shows: an elastic run on Spark has one per slot it may fill."""
        return self.max_np if self.elastic is not None and not self.on_driver else self.ranks


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a run goes once placed. `timeout`, `stall_timeout`: seconds (None or 0: none);
    `env`: variables every rank gets; `horovod_env`: Horovod's knobs over our defaults; `data`:
    a Spark DataFrame the ranks read their shards of; `mlflow`: None logs to the notebook's
    active MLflow run if any, True or an experiment's name to a new run, False never; `fresh`:
    every rank a new interpreter (None: `fresh_by_default`), not forked from a template."""

    timeout: Optional[float] = None
    stall_timeout: Optional[float] = DEFAULT_STALL_TIMEOUT
    on_stall: str = "warn"
    retries: int = 0
    name: Optional[str] = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    horovod_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    broadcast_bytes: int = DEFAULT_BROADCAST_BYTES
    timeline: bool = False
    timeline_steps: Optional[str] = None  # "A:B": the steps torch's (TensorFlow's) profiler records
    timeline_detail: Any = None  # what more it records: ("shapes", "stacks", "memory"), or ()
    tensorboard: Optional[str] = None
    data: Any = None
    equal_shards: bool = False
    data_cache: Optional[str] = None
    mlflow: Any = None
    run_dir: Optional[str] = None
    run_root: str = "hvd_runs"
    fresh: Optional[bool] = None  # ranks started as new interpreters, not forked; None: default
    ship: Any = None  # to a cluster's executors: None what the job imports, () none, or names

    def __post_init__(self):
        if self.fresh is None:
            _set(self, fresh=fresh_by_default())
        _typed(self)
        _set(self, timeout=_seconds("--timeout", self.timeout),
             stall_timeout=_seconds("--stall-timeout", self.stall_timeout),
             env=dict(self.env or {}), horovod_env=dict(self.horovod_env or {}))
        view = self.env.get("HVD_MAGIC_GPU_VIEW")  # (task/gpus.py)
        if view is not None and view not in ("own", "shared"):
            raise UsageError(f"--env HVD_MAGIC_GPU_VIEW={view}: use 'own' (each rank sees only its "
                             f"own GPUs, as cuda:0, and LOCAL_RANK=0) or 'shared' (the default: "
                             f"every rank sees its host's GPUs and pins by local rank).")
        if self.on_stall not in ON_STALL:
            raise UsageError(f"--on-stall takes {' or '.join(ON_STALL)}, not {self.on_stall!r}.")
        if self.timeline_steps is not None or self.timeline_detail:
            _set(self, timeline=True)
        _set(self, timeline_steps=_steps(self.timeline_steps or DEFAULT_TIMELINE_STEPS),
             timeline_detail=_detail(self.timeline_detail), ship=_shipped(self.ship))
        _whole("retries", self.retries, 0)
        _whole("broadcast_bytes", self.broadcast_bytes, 0)
        if self.tensorboard:
            _set(self, tensorboard=os.path.abspath(self.tensorboard))
        if self.data is None:
            if self.equal_shards:
                raise UsageError("--equal-shards evens the shards of --data: add --data NAME.")
        elif not is_dataframe(self.data):
            raise UsageError(f"--data (data=) takes a Spark DataFrame, not a "
                             f"{type(self.data).__name__}. For pandas or numpy data, name the "
                             "variable in the cell (or pass it as an argument) instead; for "
                             "files, spark.read them first.")

    def tracked(self):
        """What MLflow records of these options (`hvd_magic.driver.tracking`)."""
        return {"timeout": self.timeout, "timeline": self.timeline, "retries": self.retries,
                "name": self.name, "data": self.data is not None or None}


DEFAULT_TIMELINE_STEPS = "4:8"  # torch's profiler: steps 4 to 8 (three to warm up)
MOST_PROFILED_STEPS = 50


def _steps(text):
    """``--timeline-steps A:B`` (optimizer steps, from 1, both recorded), as "A:B"."""
    first, _, last = str(text).partition(":")
    try:
        first, last = int(first), int(last or first)
    except ValueError:
        first = last = None
    if first is None or not 2 <= first <= last or last - first >= MOST_PROFILED_STEPS:
        raise UsageError(f"--timeline-steps {text}: give the optimizer steps to profile as A:B "
                         f"(from step A to step B, both recorded; A at least 2, since torch's "
                         f"profiler starts at the end of a step; at most {MOST_PROFILED_STEPS} "
                         f"steps), e.g. --timeline-steps {DEFAULT_TIMELINE_STEPS}.")
    return f"{first}:{last}"


TIMELINE_DETAIL = {"shapes": "each operator's input shapes",
                   "stacks": "the Python stack of each operator (TensorFlow: its Python calls)",
                   "memory": "each operator's memory allocated and freed"}


def _detail(value):
    """``--timeline-detail shapes,stacks`` (a comma-separated text or a sequence of words) as
    a sorted tuple of `TIMELINE_DETAIL`'s words; () for none."""
    if not value:
        return ()
    words = value.split(",") if isinstance(value, str) else value
    if not isinstance(words, (list, tuple, set)) or not all(isinstance(w, str) for w in words):
        raise UsageError(f"timeline_detail takes the profiler's words ('shapes,stacks' or a "
                         f"list of them: {', '.join(TIMELINE_DETAIL)}), not {value!r}.")
    words = [w.strip().lower() for w in words if w.strip()]
    unknown = [w for w in words if w not in TIMELINE_DETAIL]
    if unknown:
        raise UsageError(f"--timeline-detail {','.join(unknown)}: give what the profiler records "
                         f"besides each operator's time, comma-separated: "
                         + "; ".join(f"{k} ({v})" for k, v in TIMELINE_DETAIL.items())
                         + ". E.g. --timeline-detail shapes,stacks (each costs step time).")
    return tuple(sorted(set(words)))


def is_dataframe(value):
    """A classic or a Spark Connect DataFrame (without importing Connect's client)."""
    return any(f"{k.__module__}.{k.__name__}" in ("pyspark.sql.dataframe.DataFrame",
                                                   "pyspark.sql.connect.dataframe.DataFrame",
                                                   "pyspark.sql.classic.dataframe.DataFrame")
               for k in type(value).__mro__)


def check_together(placement, options):
    """Refuse the combinations that cannot work, before anything starts; (placement, options)."""
    if options.data is not None and placement.on_driver:
        raise UsageError(f"--data (data=) needs Spark: its executors make the shards. Use "
                         f"--np {placement.ranks} (np={placement.ranks}, a Spark barrier stage) "
                         f"instead of --np {placement.np}, or start the warm session with "
                         f"%horovod_session start --np {placement.ranks}.")
    if options.data is not None and placement.elastic is not None:
        raise UsageError("--data (data=) is not available in elastic runs yet: read the data in "
                         "the function (e.g. with hvd.elastic.ElasticSampler), or leave out "
                         "--min-np.")
    return placement, options


_PLACEMENT = {f.name for f in dataclasses.fields(Placement)}
_RUN = {f.name for f in dataclasses.fields(RunOptions)}


def split(np, **options):
    """(Placement, RunOptions) from `hvd_magic.run`'s keyword arguments, checked together.
    `run_root` also says where a Spark JVM's log goes; `verbose` is the placement's."""
    unknown = sorted(set(options) - _PLACEMENT - _RUN)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    place = {k: v for k, v in options.items() if k in _PLACEMENT}
    if "run_root" in options:
        place.setdefault("log_dir", options["run_root"])
    run = {k: v for k, v in options.items() if k in _RUN}
    return check_together(Placement(np, **place), RunOptions(**run))
