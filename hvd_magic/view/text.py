"""The text view of a run (terminals, scripts, ``--text``): what the run waits on before its ranks
start, ``[rank k] line`` as lines arrive, then a summary line per rank.

Above `summary.SUMMARY_ABOVE` ranks it summarises instead (a thousand ranks' lines would scroll
past unread): rank 0's lines, a line of counts, progress and outliers every `SUMMARY_EVERY`
seconds, and at the end a line per host and the metrics across ranks (`hvd_magic.view.summary`);
every rank's full log is in the run folder."""

import os
import sys
import time

WAIT_SHOWN_AFTER = 1.0  # seconds a wait lasts before it is worth a line
SUMMARY_EVERY = 10.0    # seconds between two summary lines of a large run

from ..lines import printed
from ..words import plural, size
from .summary import hosts, is_large, summary_line, threads_text
from .summary import summary_text as large_summary
from .charts import summary_text as metrics_summary


class TextView:
    """``[rank k] line`` as lines arrive, then one summary line per rank."""

    def __init__(self, quiet=False, stdout=None, stderr=None, summary=True, verbose=False):
        self.quiet = quiet
        self.summary = summary
        self.verbose = verbose
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self._wait_shown = None      # the wait whose line is open ("starting Spark…"), if any
        self._wait_began = None
        self._waits_ended = set()    # waits whose line was ended: never opened again
        self._summarised = time.monotonic()  # when a large run's last summary line was printed

    def start(self, run):
        pass

    def event(self, run, rank, event):
        if self.quiet:
            return
        self._end_wait()
        if rank is None and event.get("message"):  # about the whole run
            # our own news (--data's shards, a ring re-formed, a note) is not an error: a
            # notebook shows stderr in red; only the stall watchdog's warning goes there
            out = self.stderr if event.get("t") == "stall" else self.stdout
            out.write(f"[hvd_magic] {event['message']}\n")
            out.flush()
            return
        if event.get("t") != "lines" or (rank != 0 and is_large(run)):
            return
        out = self.stderr if event.get("stream") == "stderr" else self.stdout
        text = "".join(f"[rank {rank}] {shown}\n" for shown in printed(
            event.get("lines", ()), self.verbose))
        if text:
            out.write(text)
            out.flush()

    def tick(self, run):
        """A wait before the ranks start gets a line once it lasts; its length ends the line."""
        if self.quiet:
            return
        if is_large(run) and run.state == "running" \
                and time.monotonic() - self._summarised >= SUMMARY_EVERY:
            self._summarised = time.monotonic()
            self.stdout.write(summary_line(run))
        waiting = getattr(run, "waiting", None)
        phase = waiting[0] if waiting and waiting[1] >= WAIT_SHOWN_AFTER else None
        # (an event ends a wait's line, and the run may still say it waits a moment longer,
        # e.g. after task 0's rendezvous event and before any rank's state: not a new wait)
        if phase == self._wait_shown or (phase is None and waiting) or phase in self._waits_ended:
            return
        self._end_wait()
        if phase is not None:
            self._wait_shown, self._wait_began = phase, time.monotonic() - waiting[1]
            self.stdout.write(f"[hvd_magic] {phase}…")
            self.stdout.flush()

    def _end_wait(self):
        if self._wait_shown is not None:
            self.stdout.write(f" {time.monotonic() - self._wait_began:.1f} s\n")
            self.stdout.flush()
            self._waits_ended.add(self._wait_shown)
            self._wait_shown = None

    def finish(self, run):
        if self.quiet:
            return
        self._end_wait()
        if not self.summary or run.started is None:  # never launched: its error says it all
            return
        if is_large(run):
            self.stdout.write(summary_text(run, per_rank=False) + large_summary(run))
        else:
            self.stdout.write(summary_text(run) + metrics_summary(run.ranks))
        self.stdout.flush()


def summary_text(run, per_rank=True):
    lines = [f"hvd_magic run {run.id}: {run.state} in {run.elapsed:.1f} s on {run.where} "
             f"(logs: {os.path.relpath(run.run_dir)})\n"]
    for host, members in hosts(run.ranks) if per_rank else ():
        threads = threads_text(members)  # their share of the host's cores (task/threads.py)
        if threads:
            lines.append(f"  on {host}: {len(members)} rank{'s' if len(members) > 1 else ''}, "
                         f"{threads}\n")
    elastic = getattr(run, "elastic", None)
    rings = [c for c in elastic.changes if c["t"] == "ring"] if elastic is not None else []
    # (a torch.distributed world's rank, or a Horovod ring's)
    whose = "Horovod rank" if rings and rings[-1].get("formed", "ring") == "ring" else "rank"
    for r in run.ranks if per_rank else ():
        host = f" on {r.host}" if r.host else ""
        progress = f", step {r.step}/{r.total}" if r.step is not None else ""
        now = getattr(r, "horovod_rank", None)
        now = f" ({whose} {now} now)" if now is not None and now != r.rank else ""
        usage = getattr(r, "usage", None)
        peak = f", memory peak {size(usage.peak_rss)}" if usage and usage.peak_rss else ""
        lines.append(f"  rank {r.rank}{now}{host}: {r.state}{progress}, "
                     f"{plural(r.lines, 'line')}{peak}\n")
    if elastic is not None and elastic.changes:  # who was lost, who joined, the ring's sizes
        lines.append(f"  membership:\n{elastic.summary()}\n")
    return "".join(lines)
