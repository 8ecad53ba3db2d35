"""The run folder on the driver: every rank's full log, ``run.json`` (what it says of the run),
files the ranks sent back.

    hvd_runs/<run id>/
        rank-<k>.log          every line rank k printed, stdout and stderr, in order, as it
                              came (terminal codes and all)
        rank-<k>.txt          the same as a person reads it (`hvd_magic.lines.printed`): a
                              bar's last redraw, no terminal codes, no C++ start-up chatter;
                              what the views' links open
        rank-<k>.attempt<n>.log, .txt   the same for the n-th process of rank k (an elastic
                              run's replacement of a lost one)
        events.jsonl          every other event (state, progress and metrics, stalls, exits), timed
        run.json              the run's state and each rank's (rewritten as the run goes)
        timeline.json         rank 0's Horovod timeline, when one was recorded
                              (timeline.json.part while it streams in)
        tensorboard/rank-<k>/ what rank k wrote to hvd_magic.tensorboard_dir(), after it ended

Everything is written as it arrives and flushed within `FLUSH_EVERY` seconds (the driver loop
calls `flush`), so a run folder tells the story of a run whose notebook was killed half-way:
nothing waits in memory for the end of the run. Not a flush per event: at hundreds of ranks that
was a system call per event, most of the driver's own cost of writing.
"""

import base64
import json
import os
import sys
import time

from ..lines import printed
from .metrics import MetricHistory

FILE_KINDS = {"timeline": "timeline.json"}   # files a task may send back, and their names
# folders of binary files a task may send back: TensorBoard's logs; torch's error file of a
# failed rank (TORCHELASTIC_ERROR_FILE, what `torch.distributed.elastic...errors.record` writes)
# torch's profile of a few steps (--timeline without Horovod: rank/profile.py)
FOLDER_KINDS = {"tensorboard", "torchelastic", "profile"}
FLUSH_EVERY = 0.2                             # seconds at most between a write and its flush


class RunFolder:
    def __init__(self, path):
        self.path = path
        self.files = {}              # kind -> path of a file received from the ranks
        self.tensorboard = None      # where the ranks' TensorBoard logs came back (a folder)
        self._logs = {}              # rank -> (its raw log, its readable log), open
        self._attempts = {}          # rank -> its process's attempt, when not the first
        self._events = None
        self._events_start = 0       # where this run's events begin in events.jsonl
        self._dirty = set()          # files written since the last flush
        self._read_back = None       # (rank, {higher rank: MetricHistory}) of `metric_history`

    def create(self, np):
        os.makedirs(self.path, exist_ok=True)
        for rank in range(np):  # every rank has a log, even one that prints nothing
            self._log(rank)
        self._events = open(os.path.join(self.path, "events.jsonl"), "a", encoding="utf-8")
        self._events_start = self._events.tell()  # (a run_dir used again: this run's follow)

    def log_path(self, rank, readable=False, attempt=None):
        """Rank `rank`'s log (raw, or `readable`); in an elastic run, its latest attempt's (or
        `attempt`'s: a lost process's)."""
        attempt = attempt or self._attempts.get(rank, 1)
        name = f"rank-{rank}" if attempt == 1 else f"rank-{rank}.attempt{attempt}"
        return os.path.join(self.path, name + (".txt" if readable else ".log"))

    def earlier_logs(self, rank):
        """The readable logs of rank `rank`'s earlier processes (an elastic run's lost ones),
        oldest first."""
        return [self.log_path(rank, True, a) for a in range(1, self._attempts.get(rank, 1))]

    def new_attempt(self, rank, attempt):
        """Rank `rank` has a new process (an elastic replacement): its lines go to new logs,
        the earlier attempts' logs are kept."""
        for f in self._logs.pop(rank, ()):
            f.close()
        self._attempts[rank] = attempt
        self._log(rank)

    def _log(self, rank):
        files = self._logs.get(rank)
        if files is None:
            files = self._logs[rank] = tuple(
                open(self.log_path(rank, readable), "a", encoding="utf-8", errors="replace")
                for readable in (False, True))
        return files

    def write_lines(self, rank, lines):
        raw, readable = self._log(rank)
        if lines:
            raw.write("\n".join(lines) + "\n")
            readable.write("".join(f"{line}\n" for line in printed(lines)))
            self._dirty.update((raw, readable))

    def record(self, event):
        """Append an event (not lines, not file chunks) to events.jsonl, with the time; also
        once the folder is closed (a bug of ours met while the run ended: its traceback)."""
        line = json.dumps(dict(event, time=round(time.time(), 3)), default=str) + "\n"
        if self._events is not None and self._events.closed:
            with open(self._events.name, "a", encoding="utf-8") as f:
                f.write(line)
            return
        self._events.write(line)
        self._dirty.add(self._events)

    def metric_history(self, rank):
        """Every metric point rank `rank` reported, read back from events.jsonl (each progress
        event is there with its points), as a `MetricHistory` that keeps them all; None if the
        file cannot be read. What the driver's own history thinned, for `Run.metrics`.

        Run.metrics asks for every rank in turn: the file is read once for the ranks from this
        one up, each handed out once (none kept after); a rank asked for again or out of order
        reads the file again. A live run's last `FLUSH_EVERY` seconds may not be there yet."""
        if self._read_back is None or rank <= self._read_back[0]:
            try:
                self._read_back = (rank, _read_histories(
                    os.path.join(self.path, "events.jsonl"), self._events_start, rank))
            except OSError:
                return None
        histories = self._read_back[1]
        history = histories.pop(rank, None)
        for other in [r for r in histories if r < rank]:  # (not asked for: nothing kept)
            del histories[other]
        self._read_back = (rank, histories) if histories else None
        return history

    def flush(self):
        """Flush what was written since the last call (the driver loop calls it every
        `FLUSH_EVERY` seconds)."""
        dirty, self._dirty = self._dirty, set()
        for f in dirty:
            if not f.closed:
                f.flush()

    def close(self):
        self._dirty.clear()
        for f in [*(f for files in self._logs.values() for f in files), self._events]:
            if f is not None:
                f.close()

    def receive(self, event):
        """Append a chunk of a file a task sent (rank 0's timeline) to the folder."""
        name = FILE_KINDS[event["kind"]]
        partial = os.path.join(self.path, name + ".part")
        if event.get("seq") == 0 and os.path.exists(partial):
            os.remove(partial)
        with open(partial, "a", encoding="utf-8") as f:
            f.write(str(event.get("data", "")))
        if event.get("last"):
            self.files[event["kind"]] = partial

    def receive_file_of_folder(self, rank, event, root=None):
        """Write a chunk of a binary file a task sent from a rank's folder (TensorBoard logs,
        torch's error file) under `root` (default: the run folder's folder of that kind)."""
        rel = os.path.normpath(str(event.get("path", "")))
        if os.path.isabs(rel) or rel.startswith(".."):
            raise ValueError(f"a file outside its folder: {rel!r}")
        root = root or os.path.join(self.path, event["kind"])
        if event["kind"] == "tensorboard":
            self.tensorboard = root
        path = os.path.join(root, f"rank-{rank}", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb" if event.get("seq") == 0 else "ab") as f:
            f.write(base64.b64decode(str(event.get("data", ""))))

    def has_partial(self, kind):
        return kind in self.files or os.path.exists(os.path.join(self.path, FILE_KINDS[kind] + ".part"))

    def log_tail(self, rank, lines=40):
        """The last words of a rank that died: from the crash report on, if there is one."""
        try:
            with open(self.log_path(rank), encoding="utf-8", errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            return ""
        starts = [i for i, line in enumerate(tail)
                  if line.startswith(("Fatal Python error", "terminate called"))]
        if starts:
            tail = tail[starts[0]:]
        return "\n".join(line for line in tail
                         if not line.startswith("Extension modules:")).rstrip()

    def write_meta(self, run):
        """``run.json``: `run`'s state and each rank's now, replaced whole (never half-written)."""
        meta = {
            "id": run.id, "np": run.np, "state": run.state, "where": run.where,
            "started": run.started, "ended": run.ended, "name": run.name,
            "shards": run.shards, "membership": run.membership,
            "profile": run.profile,  # --timeline without Horovod (what %horovod_timeline says)
            # what the Spark JVM that this run started printed, if it started one
            "spark_log": getattr(run.launcher, "log_path", None),
            # which notebook's kernel drives it: the next kernel of that notebook says which of
            # its runs ended with this one (hvd_magic.frontends.ended_runs)
            "notebook": os.environ.get("JPY_SESSION_NAME"), "kernel": _kernel(),
            "ranks": [r.as_dict() for r in run.ranks]}
        tmp = os.path.join(self.path, "run.json.tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(meta, default=str))  # one line: the C encoder (indent is pure Python)
        os.replace(tmp, os.path.join(self.path, "run.json"))


def _kernel():
    """{"pid": this process, "ending": whether its kernel was told to shut down (a restart)}."""
    shell = None
    if "IPython" in sys.modules:  # (never imported: no kernel, nothing ending)
        from IPython import get_ipython
        shell = get_ipython()
    return {"pid": os.getpid(), "ending": bool(getattr(shell, "exit_now", False))}


def _read_histories(path, start, lowest):
    """{rank: MetricHistory of all its points} from the progress events in an events.jsonl
    from byte `start` on, for the ranks from `lowest` up (a line cut short is skipped)."""
    histories = {}
    with open(path, "rb") as f:
        f.seek(start)
        for line in f:
            if b'"progress"' not in line:  # (most lines are; this skips decoding the rest)
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            rank, points = event.get("rank"), event.get("points")
            if event.get("t") == "progress" and isinstance(rank, int) and rank >= lowest \
                    and isinstance(points, list):
                history = histories.get(rank)
                if history is None:
                    history = histories[rank] = MetricHistory(keep=None)
                history.extend(points)
    return histories
