"""`RankState`: what the driver knows of one rank, updated from its events; views read it."""

import time

from .metrics import MetricHistory
from .usage import Usage

# States in which a rank has not ended yet.
LIVE_STATES = ("pending", "starting", "rendezvous", "running")


class RankState:
    def __init__(self, rank):
        self.rank = rank
        self.horovod_rank = None    # elastic runs: its Horovod rank in the current ring, if any
        self.attempt = 1            # elastic runs: its process's number (2: the first replacement)
        self.host = None
        self.local_rank = None
        self.gpus = []              # its own GPUs' ids (CUDA's, as the host names them)
        self.gpu_index = []         # ...and their places in what it sees (its cuda:i)
        self.threads = None         # its CPU threads per library (OMP_NUM_THREADS: task/threads.py)
        self.executor = None
        self.partition = None
        self.pid = None
        self.state = "pending"
        self.step = None
        self.total = None
        self.metrics = {}           # the latest value of each metric
        self.history = MetricHistory()  # every [step, {metric: value}] reported, in columns
        self.usage = Usage()        # its CPU, memory and GPUs, sampled by its task (usage.py)
        self.clock = None           # its host's clock against ours: (offset, uncertainty) in s
        self.last_line = ""
        self.lines = 0
        self.exit = None     # {"code", "status", "summary"} once the rank ended
        self.ended_at = None
        self.blocked_since = None   # monotonic time it began waiting for its peers, if it does
        self.blocked_op = None      # what it waits in: "init", "all_reduce"... (rank/stall.py)
        self.last_event = time.monotonic()

    def as_dict(self):
        state = {k: v for k, v in vars(self).items() if k not in (
            "last_event", "ended_at", "blocked_since", "blocked_op", "history", "usage")}
        return dict(state, resources=self.usage.as_dict())


def is_rank(value, np):
    """True for a rank of a run of `np`: an int in range (a peer's ``True`` is no rank 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < np


def ranks_text(ranks):
    """"rank 3" or "ranks 1, 2"."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r.rank) for r in ranks)}"


