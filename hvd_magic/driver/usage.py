"""What each rank used (its task's ``resources`` events: `hvd_magic.task.resources`), kept on the
driver: the latest sample, the peaks, and a history thinned as it grows; and the run's two tables
(`Tables`: ``Run.metrics``, ``Run.resources``).

A sample a second per rank is 3,600 an hour: each rank keeps at most `KEEP` points, and when
that many are kept every other one is dropped and later samples are kept at half the rate, so
a long run's history spans it all at a coarser step (the peaks count every sample).

Not for: sampling (`hvd_magic.task.resources`) or drawing (`hvd_magic.view`).
"""

import datetime
import time
from array import array

KEEP = 720
NEAR_LIMIT = 0.9   # a rank at this share of its memory limit is marked
IDLE_CPU = 2.0     # % of one core: a process tree using less waits; it does not work


class Usage:
    """One rank's samples. The history is kept in typed columns (24 bytes a sample, GPUs aside):
    1,024 ranks keep at most 18 MB of it."""

    def __init__(self):
        self.latest = None     # the newest event as sent
        self.peak_rss = 0
        self.peak_cpu = 0.0
        self.peak_gpu_mem = {}  # GPU index -> bytes
        self._columns = (array("d"), array("d"), array("d"))  # time, cpu, rss: thinned
        self._gpus = []        # {gpu index: (util, mem)} of each kept sample, where it had GPUs
        self._every = 1        # keep one sample in this many
        self._seen = 0
        self.idle_since = None  # monotonic time since when every sample said: no CPU, no GPU

    def add(self, event):
        rss, cpu = int(event.get("rss") or 0), float(event.get("cpu") or 0.0)
        if not rss:  # (no live process has none: an ended one's, which older tasks sent)
            return
        gpus = {g["index"]: (g.get("util"), g.get("mem")) for g in event.get("gpus") or ()
                if isinstance(g, dict) and "index" in g}
        self.latest = event
        busy = cpu >= IDLE_CPU or any(util for util, _ in gpus.values())
        self.idle_since = None if busy else (self.idle_since or time.monotonic())
        self.peak_rss = max(self.peak_rss, rss, int(event.get("peak") or 0))
        self.peak_cpu = max(self.peak_cpu, cpu)
        for index, (_, mem) in gpus.items():
            self.peak_gpu_mem[index] = max(self.peak_gpu_mem.get(index, 0), mem or 0)
        self._seen += 1
        if self._seen % self._every:
            return
        for column, value in zip(self._columns, (event.get("time") or 0.0, cpu, rss)):
            column.append(value)
        if gpus or self._gpus:
            self._gpus += [{}] * (len(self._columns[0]) - 1 - len(self._gpus)) + [gpus]
        if len(self._columns[0]) >= KEEP:
            self._columns = tuple(column[::2] for column in self._columns)
            self._gpus = self._gpus[::2]
            self._every *= 2

    def memory(self):
        """(times, rss values) of the kept samples: the columns themselves, for charts."""
        return self._columns[0], self._columns[2]

    @property
    def points(self):
        """[(unix time, cpu %, rss bytes, {gpu index: (util %, mem bytes)})], oldest first."""
        times, cpus, rsss = self._columns
        gpus = self._gpus + [{}] * (len(times) - len(self._gpus))
        return [(t, c, int(r), g) for t, c, r, g in zip(times, cpus, rsss, gpus)]

    def cpu_share(self, cpu=None):
        """`cpu` (% of one core; the latest sample's by default) as a share (%) of the cores the
        rank may use (its affinity, its cgroup's quota: `task/resources.py`), and how many."""
        latest = self.latest or {}
        cores = latest.get("cores") or 1
        return (latest.get("cpu", 0.0) if cpu is None else cpu) / cores, cores

    @property
    def limit(self):
        return (self.latest or {}).get("limit")

    def near_limit(self):
        """True while the rank's memory is past NEAR_LIMIT of its limit."""
        latest = self.latest or {}
        return bool(latest.get("limit")) and latest.get("rss", 0) >= NEAR_LIMIT * latest["limit"]

    def as_dict(self):
        """What run.json keeps: the peaks and the limit."""
        if self.latest is None:
            return None
        return {"peak_rss": self.peak_rss, "peak_cpu": self.peak_cpu, "limit": self.limit,
                "limit_of": self.latest.get("limit_of"),
                "peak_gpu_mem": {str(k): v for k, v in self.peak_gpu_mem.items()}}


class Tables:
    """A run's figures as pandas DataFrames (for `Run`)."""

    @property
    def metrics(self):
        """Every metric the ranks reported (`hvd_magic.report`, framework callbacks), as a
        pandas DataFrame with one row per value: rank, step, name, value."""
        import pandas as pd

        frames = [pd.DataFrame({"rank": r.rank, "step": steps, "name": name, "value": values})
                  for r in self.ranks for name, (steps, values) in r.history.columns().items()]
        if not frames:
            return pd.DataFrame(columns=["rank", "step", "name", "value"])
        return pd.concat(frames, ignore_index=True)

    @property
    def resources(self):
        """What every rank used, about once a second (thinned in long runs), as a pandas
        DataFrame: rank, time, cpu (% of one core, the rank and its child processes), rss
        (bytes), and gpu<i>_util (%) and gpu<i>_mem (bytes) for each GPU a rank had."""
        import pandas as pd

        rows = []
        for r in self.ranks:
            for when, cpu, rss, gpus in r.usage.points:
                row = {"rank": r.rank, "time": datetime.datetime.fromtimestamp(when or 0),
                       "cpu": cpu, "rss": rss}
                for index, (util, mem) in gpus.items():
                    row[f"gpu{index}_util"], row[f"gpu{index}_mem"] = util, mem
                rows.append(row)
        return pd.DataFrame(rows, columns=None if rows else ["rank", "time", "cpu", "rss"])
