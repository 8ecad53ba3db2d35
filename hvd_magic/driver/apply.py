"""One event from a task, applied to its run: what the driver loop does with each event.

- lines go to the rank's log (and to the view, unless the rank marked them ``log_only``); state, progress, blocked and exit events to its `RankState`;
- in an elastic run, a lost rank, its replacement and each new ring go to `run.elastic`
  (`hvd_magic.driver.membership`) instead of failing the run;
- the tasks' rendezvous values (task 0's ports, each task's own) are gathered and relayed to all;
- files sent back (timeline, TensorBoard logs) land in the run folder;
- every event but lines and files is recorded in ``events.jsonl``, and the view sees them all.

Not for: when to stop or how (`hvd_magic.driver.loop`); `request_stop` is handed in.
"""

import functools
import time

from ..errors import is_follow_on, is_peer_gone
from ..lines import is_aside, is_chatter, last_said
from ..timelines import ranks as ranks_timeline
from .folder import FILE_KINDS, FOLDER_KINDS
from .ranks import is_rank


def apply_event(run, event, request_stop):
    """Apply `event` to `run`; True when it changed what ``run.json`` says (write it soon)."""
    if event.get("t") == "ring" and run.elastic is not None:  # from the elastic launcher
        return run.elastic.ring(run, event)
    rank = event.get("rank")
    if not is_rank(rank, run.np):
        return False
    r = run.ranks[rank]
    r.last_event = time.monotonic()
    kind = event.get("t")
    if kind == "stacks":  # an answer to `Run.stacks()` (driver/stacks.py): not an event to keep
        run.stack_answer(rank, event)
        return False
    if kind == "debug":  # a rank held in pdb (driver/debugger.py)
        run.debug_event(rank, event)
        return False
    if kind == "lines":
        lines = [str(x) for x in event.get("lines", [])]
        run.folder.write_lines(rank, lines)
        if event.get("log_only"):  # (a warm session's reset: Horovod on the lost peer)
            return False
        r.lines += len(lines)
        _last_line(r, lines)
    elif kind == "state":
        if event.get("state") == "starting" and r.pid is not None and event.get("pid") != r.pid:
            if run.elastic is not None:
                run.elastic.joined(run, r, event)  # a lost rank's replacement
            else:
                _retried(run, rank, request_stop)
        r.state = str(event.get("state", r.state))
        for key in ("host", "local_rank", "pid", "gpus", "gpu_index", "executor", "partition",
                    "threads"):
            if key in event:
                setattr(r, key, event[key])
    elif kind == "progress":
        if run.elastic is not None:
            run.elastic.progressed(run)
        r.step, r.total = event.get("step"), event.get("total")
        points = event.get("points")
        if isinstance(points, list):
            if r.history.read_back is None:  # what it thins stays in events.jsonl: read there
                r.history.read_back = functools.partial(run.folder.metric_history, rank)
            # (MetricHistory skips what is not [step, {...}]) The row's values are the latest of
            # each metric: the rank's throttle sends only its newest event, whose own metrics
            # may be empty (a bar's step after the values logged), so the points it carries are
            # what the rank last reported.
            r.metrics.update(r.history.extend(points))
        if isinstance(event.get("metrics"), dict):
            r.metrics.update(event["metrics"])
    elif kind == "rendezvous":
        # task 0 serves the frameworks' rendezvous, every task reserves its own: all to every task
        relayed = run.gathering.add(rank, event)
        if relayed is not None:
            run._server.announce({"t": "rendezvous", "relay": relayed})
            if run.profile:  # every task is here: each host's clock against ours
                ranks_timeline.ask_clocks(run._server)
    elif kind == "clock":
        ranks_timeline.heard_clock(r, event)
    elif kind == "file" and event.get("kind") in FILE_KINDS:
        run.folder.receive(event)
    elif kind == "file" and event.get("kind") in FOLDER_KINDS:
        root = run.tensorboard if event["kind"] == "tensorboard" else None
        run.folder.receive_file_of_folder(rank, event, root)
    elif kind == "resources":
        r.usage.add(event)
    elif kind == "blocked":
        seconds = event.get("seconds")
        r.blocked_since = time.monotonic() - (seconds if isinstance(seconds, (int, float)) else 0)
        r.blocked_op = str(event.get("op"))
    elif kind == "unblocked":
        r.blocked_since = r.blocked_op = None
    elif kind == "exit":
        r.blocked_since = r.blocked_op = None
        r.exit = {k: event.get(k) for k in ("code", "status", "summary")}
        r.ended_at = time.monotonic()
        status = event.get("status")
        # ("lost": a warm session's rank lost before this cell; the cell runs without it)
        r.state = ended_state(run, status, event.get("summary"))
        if status == "died" and run.elastic is not None and run.stop_reason is None:
            if run.elastic.lost(run, r, event):  # the others go on without it; if none is
                request_stop("failed")           # left, the state went with them
        elif status not in ("ok", "stopped", "lost"):
            run.failures.append(dict(event.get("summary") or {}, rank=rank, status=status,
                                     after_stop=run.stop_reason is not None))
    recorded = kind not in ("lines", "file", "resources", "clock")  # (resources: in r.usage)
    if recorded:
        run.folder.record(event)
    if run.view is not None:
        run.view.event(run, rank, event)
    return recorded


def _last_line(r, lines):
    """The rank's last line after `lines`: the last that shows something and is not a peer's
    going (`hvd_magic.lines.last_said`: only as many looked at as it takes; at np 1024 this
    sees ~100,000 lines a second). A warning or an advert replaces only a line of its kind."""
    text, aside = last_said(line for line in reversed(lines)
                            if not is_peer_gone(line) and not is_chatter(line))
    if text and (not aside or not r.last_line or is_aside(r.last_line)):
        r.last_line = text


def ended_state(run, status, summary=None):
    """A rank's state once it ended. A bystander is "stopped" in every view: stopped by the
    driver because another rank failed (or the run timed out, stalled), or failed only because
    a peer went away (`is_follow_on`: a Gloo connection reset) while another rank failed
    too; "cancelled" is for a run the user cancelled."""
    if status in ("ok", "lost"):
        return {"ok": "done", "lost": "lost"}[status]
    stopped = "cancelled" if run.stop_reason == "cancelled" else "stopped"
    if status == "stopped":
        return stopped
    caused = any(not is_follow_on(f) for f in run.failures) or \
        run.stop_reason in ("cancelled", "timeout", "stalled")
    # (a rank in a collective when a cancel took its peer first is cancelled as its peer is)
    return stopped if caused and is_follow_on(summary or {}) else "failed"


def _retried(run, rank, request_stop):
    """A second start of a rank: Spark re-attempted the barrier stage after a failure."""
    if run.allow_retry:
        return
    if run.retry is None:
        run.retry = {"rank": rank, "earlier": [dict(f) for f in run.failures]}
    request_stop("retried")
