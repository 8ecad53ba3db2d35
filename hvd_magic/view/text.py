"""The text view of a run (terminals, scripts, ``--text``): ``[rank k] line`` as lines arrive,
then a summary line per rank."""

import os
import sys

from .charts import summary_text as metrics_summary


def visible_text(line):
    r"""What a terminal shows of a line with carriage returns: the text after the last one.

    A progress bar redrawn with ``\r`` shows as its last state; a trailing ``\r`` (a ``\r\n``
    line end) is not a redraw.
    """
    return line.rstrip("\r").rsplit("\r", 1)[-1]


class TextView:
    """``[rank k] line`` as lines arrive, then one summary line per rank."""

    def __init__(self, quiet=False, stdout=None, stderr=None, summary=True):
        self.quiet = quiet
        self.summary = summary
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    def start(self, run):
        pass

    def event(self, run, rank, event):
        if self.quiet:
            return
        if rank is None and event.get("message"):  # about the whole run (the stall watchdog)
            self.stderr.write(f"[hvd_magic] {event['message']}\n")
            self.stderr.flush()
            return
        if event.get("t") != "lines":
            return
        out = self.stderr if event.get("stream") == "stderr" else self.stdout
        text = "".join(f"[rank {rank}] {visible_text(line)}\n" for line in event.get("lines", ()))
        out.write(text)
        out.flush()

    def tick(self, run):
        pass

    def finish(self, run):
        if self.quiet or not self.summary:
            return
        self.stdout.write(summary_text(run) + metrics_summary(run.ranks))
        self.stdout.flush()


def summary_text(run):
    lines = [f"hvd_magic run {run.id}: {run.state} in {run.elapsed:.1f} s on {run.where} "
             f"(logs: {os.path.relpath(run.run_dir)})\n"]
    for r in run.ranks:
        host = f" on {r.host}" if r.host else ""
        progress = f", step {r.step}/{r.total}" if r.step is not None else ""
        lines.append(f"  rank {r.rank}{host}: {r.state}{progress}, {r.lines} lines\n")
    return "".join(lines)
