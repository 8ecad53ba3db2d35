"""The plain Python API: `run(fn, np=...)` returns a `Run`. The magics are a thin shell over it.

A run, from the driver's side:
1. the function and its arguments are pickled, each argument on its own, so that everything that
   cannot travel is named at once (`UsageError`) before any job starts; large ones go by broadcast;
2. an `EventServer` is opened for the run, and the launcher (Spark barrier stage, or driver-only
   threads) starts the tasks;
3. the driver loop turns the tasks' events into per-rank state, full logs in ``run_dir`` and view
   updates, stops every rank as soon as one fails (or on interrupt / timeout), and gathers the
   ranks' values in rank order.
"""

import datetime
import json
import os
import pickle
import queue
import re
import secrets
import sys
import threading
import time

from IPython.core.error import UsageError

from .errors import LaunchError, RankError, RunCancelled, RunTimeout, describe_end, is_follow_on
from .events import EventServer
from .task import STOP_GRACE_SECONDS, TaskSettings

DEFAULT_BROADCAST_BYTES = 4 * 1024 * 1024
DEFAULT_STALL_TIMEOUT = 60.0
FILE_KINDS = {"timeline": "timeline.json"}   # files a task may send back, and their names
DEFAULT_HOROVOD_ENV = {
    # horovodrun exports '(None,)' for these (a 0 ms cycle that spins); we set them ourselves.
    "HOROVOD_CYCLE_TIME": "1",
    "HOROVOD_CACHE_CAPACITY": "1024",
    # Bounds the rendezvous and every collective: it must cover rank start-up skew and a rank
    # that computes alone for a while (evaluation on rank 0). Dead ranks are noticed at once anyway.
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "300",
}
_ADVICE = {
    "SparkSession": "Spark objects live on the driver only; read the data inside the cell "
                    "(or pass a pandas/numpy copy)",
    "SparkContext": "Spark objects live on the driver only; create what you need inside the cell",
    "DataFrame": "a Spark DataFrame lives on the driver; pass df.toPandas() or read the data "
                 "inside the cell",
    "SummaryWriter": "create it inside the cell",
    "TextIOWrapper": "open the file inside the cell",
    "BufferedReader": "open the file inside the cell",
    "BufferedWriter": "open the file inside the cell",
    "socket": "open the connection inside the cell",
    "generator": "build the generator inside the cell (or pass list(...) of it)",
    "lock": "create it inside the cell",
    "Thread": "start threads inside the cell",
}


class _History:
    """Every run of this process, newest last (what `runs()` and `last_run()` read)."""

    def __init__(self):
        self.runs = []
        self.lock = threading.Lock()

    def add(self, run):
        with self.lock:
            self.runs.append(run)


_history = _History()


def runs():
    """Every run started in this process, oldest first."""
    with _history.lock:
        return list(_history.runs)


def last_run():
    """The latest run (finished or not), or None."""
    with _history.lock:
        return _history.runs[-1] if _history.runs else None


def new_run_id():
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


# --- pickling, with a check per value ----------------------------------------------------------

def pickle_values(values, kind="name"):
    """Pickle each value on its own; raise UsageError naming every one that cannot travel."""
    import cloudpickle

    pickled, failures = {}, []
    for name, value in values.items():
        try:
            pickled[name] = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # pickling can fail with almost any exception type
            type_name = type(value).__name__
            advice = _ADVICE.get(type_name) or next(
                (a for key, a in _ADVICE.items() if key.lower() in type_name.lower()),
                "create it inside the cell, or pass something picklable")
            reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            failures.append(f"  `{name}` ({type_name}) cannot be sent to the ranks: {advice}. "
                            f"[{reason}]")
    if failures:
        raise UsageError(f"{len(failures)} {kind}{'s' if len(failures) > 1 else ''} cannot be "
                         "pickled, so no job was started:\n" + "\n".join(failures))
    return pickled


# --- per-rank state ------------------------------------------------------------------------

class RankState:
    """What the driver knows of one rank, updated from its events."""

    def __init__(self, rank):
        self.rank = rank
        self.host = None
        self.local_rank = None
        self.gpus = []
        self.executor = None
        self.partition = None
        self.pid = None
        self.state = "pending"
        self.step = None
        self.total = None
        self.metrics = {}
        self.last_line = ""
        self.lines = 0
        self.exit = None     # {"code", "status", "summary"} once the rank ended
        self.ended_at = None
        self.blocked_since = None   # monotonic time it began waiting in a collective, if it does
        self.last_event = time.monotonic()

    def as_dict(self):
        return {k: v for k, v in vars(self).items()
                if k not in ("last_event", "ended_at", "blocked_since")}


class Run:
    """One launch of a function on N ranks. `results` are in rank order; `value` is rank 0's."""

    def __init__(self, np, run_dir=None, launcher=None, view=None, timeout=None, cell=None,
                 horovod_env=None, extra_env=None, broadcast_bytes=DEFAULT_BROADCAST_BYTES,
                 allow_retry=False, name=None, timeline=False, stall_timeout=DEFAULT_STALL_TIMEOUT,
                 on_stall="warn", run_root="hvd_runs"):
        self.id = new_run_id()
        self.np = np
        self.name = name
        self.run_dir = os.path.abspath(run_dir or os.path.join(run_root, self.id))
        self.launcher = launcher
        self.view = view
        self.timeout = timeout
        self.cell = cell
        self.horovod_env = {**DEFAULT_HOROVOD_ENV, **(horovod_env or {})}
        self.extra_env = dict(extra_env or {})
        self.broadcast_bytes = broadcast_bytes
        self.allow_retry = allow_retry
        self.state = "pending"
        self.ranks = [RankState(r) for r in range(np)]
        self.results = None
        self.exports = {}
        self.error = None
        self.where = None
        self.started = None
        self.ended = None
        self.rejected_frames = 0
        self.rejected_events = 0     # authenticated events that made no sense
        self.broadcast_names = []    # values that travelled by broadcast
        self.files = {}              # kind -> path of a file received from the ranks
        self.timeline = timeline
        self.timeline_path = None    # run_dir/timeline.json once rank 0's timeline came back
        self._failures = []          # exit events of failed ranks, in arrival order
        self._retry = None           # set when Spark re-attempted the stage (and we refused)
        self.stall = None            # the watchdog's message, once it fired
        self.stall_timeout = stall_timeout
        self.on_stall = on_stall
        self._stop_reason = None
        self._stop_sent = None
        self._done = threading.Event()
        self._server = None
        self._logs = {}
        self._thread = None

    # -- public -------------------------------------------------------------------------------
    @property
    def value(self):
        """Rank 0's value."""
        return self.results[0] if self.results else None

    @property
    def elapsed(self):
        if self.started is None:
            return 0.0
        return (self.ended or time.time()) - self.started

    def log_path(self, rank):
        return os.path.join(self.run_dir, f"rank-{rank}.log")

    def wait(self, timeout=None):
        """Wait for a background run to end; raise its error, or return its results."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"run {self.id} is still {self.state} after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.results

    def cancel(self):
        """Stop every rank (as a kernel interrupt would); the run ends 'cancelled'."""
        self._request_stop("cancelled")

    def __repr__(self):
        return f"<Run {self.id} np={self.np} {self.state}>"

    # -- launching ----------------------------------------------------------------------------
    def launch(self, job, kwargs_pickled, background=False):
        """Start the ranks. `job` is {"fn", "args", "sources", ...} with args already pickled."""
        os.makedirs(self.run_dir, exist_ok=True)
        self.launcher.prepare(self.np)
        self.where = self.launcher.where
        small = {n: d for n, d in kwargs_pickled.items() if len(d) <= self.broadcast_bytes}
        # Large values travel once per executor (a Spark broadcast), not inside every task; the
        # pickled bytes are dropped here as soon as they are broadcast, to spare driver memory.
        broadcasts = {}
        for name in [n for n in kwargs_pickled if n not in small]:
            broadcasts[name] = self.launcher.broadcast(kwargs_pickled.pop(name))
        self.broadcast_names = sorted(broadcasts)
        job = dict(job, kwargs=small)
        self._server = EventServer(host=_bind_host(self.launcher))
        settings = TaskSettings(
            run_id=self.id, np=self.np, events_address=f"{self.launcher.driver_host}:{self._server.port}",
            token=self._server.token, job=pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL),
            horovod_env=self.horovod_env, cwd=os.getcwd(), allow_retry=self.allow_retry,
            broadcast_kwargs=broadcasts,
            extra_env=self.extra_env, timeline=self.timeline)
        for rank in range(self.np):  # every rank has a log, even one that prints nothing
            self._log(rank)
        self.started = time.time()
        self.state = "running"
        self.background = background  # a view shows a background run at once (its cell ends now)
        self._write_meta()
        _history.add(self)
        if self.view is not None:
            self.view.start(self)
        self.launcher.start(settings, self.np)
        if background:
            self._thread = threading.Thread(target=self._drive_safely, name=f"hvd-magic-run-{self.id}",
                                            daemon=True)
            self._thread.start()
            return self
        self._drive()
        return self

    def _drive_safely(self):
        try:
            self._drive()
        except BaseException:  # kept on the run; raised by wait()
            pass

    # -- the driver loop ----------------------------------------------------------------------
    def _drive(self):
        try:
            deadline = None if not self.timeout else self.started + self.timeout
            while not self.launcher.done():
                self._pump(0.1)
                if self._failures and self._stop_reason is None:
                    self._request_stop("failed")
                if deadline is not None and time.time() > deadline and self._stop_reason is None:
                    self._request_stop("timeout")
                self._watch_for_stall()
                self._escalate()
                if self.view is not None:
                    self.view.tick(self)
        except KeyboardInterrupt:
            self._request_stop("cancelled")
            self._wait_stopped()
        finally:
            try:
                self._drain()
                self._finish()
            finally:
                self._done.set()
        if self.error is not None:
            raise self.error

    def _watch_for_stall(self):
        """Horovod never notices a rank that stopped calling collectives (its stall inspector does
        not run with Gloo): some ranks finished while the others wait forever. Say so, with a
        stack dump of every waiting rank, and stop the run when asked to (--on-stall fail)."""
        if self.stall_timeout is None or self._stop_reason is not None or self.stall is not None:
            return
        now = time.monotonic()
        waiting = [r for r in self.ranks if r.exit is None and r.blocked_since is not None
                   and now - r.blocked_since >= self.stall_timeout]
        elsewhere = [r for r in self.ranks if r.exit is not None or r.blocked_since is None]
        if not waiting or not elsewhere:
            return  # nobody waits that long, or everybody waits (a slow collective, not a stall)
        ended = [r for r in elsewhere if r.exit is not None]
        busy = [r for r in elsewhere if r.exit is None]

        def ranks(rs):
            return f"rank{'s' if len(rs) > 1 else ''} {', '.join(str(r.rank) for r in rs)}"

        why = []
        if ended:
            why.append(f"{ranks(ended)} ended")
        if busy:
            why.append(f"{ranks(busy)} {'are' if len(busy) > 1 else 'is'} running elsewhere")
        self.stall = (
            f"stall: {ranks(waiting)} {'have' if len(waiting) > 1 else 'has'} been waiting in a "
            f"collective for {now - min(r.blocked_since for r in waiting):.0f} s, while "
            f"{' and '.join(why)}: the waiting ranks are blocked on a collective (allreduce, "
            f"broadcast...) that the others never called, e.g. a loop that ran fewer steps on "
            f"some ranks. The Python stack of every rank is in its log.")
        self._server.broadcast({"t": "dump"})  # each stuck rank prints its stack (faulthandler)
        if self.view is not None:
            self.view.event(self, None, {"t": "stall", "message": self.stall})
        if self.on_stall == "fail":
            self._request_stop("stalled")

    def _request_stop(self, reason):
        if self._stop_reason is not None:
            return
        self._stop_reason = reason
        self._stop_sent = time.monotonic()
        if self._server is not None:
            self._server.stop_all(reason)

    def _escalate(self):
        """Tasks that did not end after the stop request: cancel the Spark job itself."""
        if self._stop_sent is not None and time.monotonic() - self._stop_sent > STOP_GRACE_SECONDS + 2:
            self.launcher.cancel()

    def _wait_stopped(self):
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 10
        while not self.launcher.done() and time.monotonic() < deadline:
            try:
                self._pump(0.1)
                self._escalate()
            except KeyboardInterrupt:  # a second interrupt: stop waiting politely
                self.launcher.cancel()
        self.launcher.join(timeout=5)

    def _pump(self, timeout):
        try:
            event = self._server.events.get(timeout=timeout)
        except queue.Empty:
            return
        self._handle(event)
        while True:  # take everything already waiting, without blocking
            try:
                event = self._server.events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

    def _drain(self):
        if self._server is None:
            return
        self.launcher.join(timeout=5)
        self._stop_orphans()
        time.sleep(0)  # let connection threads queue what they read
        self._server.close()
        while True:
            try:
                self._handle(self._server.events.get_nowait())
            except queue.Empty:
                break
        self.rejected_frames = self._server.rejected

    def _stop_orphans(self):
        """The launcher is done but some ranks never said they ended: Spark gave up on their
        tasks without killing the Python workers. Tell those tasks to stop their ranks, and wait
        for them to say so."""
        if not self._unended():
            return
        self._server.stop_all(self._stop_reason or "failed")
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 2
        while self._unended() and time.monotonic() < deadline:
            self._pump(0.1)

    def _unended(self):
        """Ranks that started and did not report their end."""
        return [r for r in self.ranks if r.pid is not None and r.exit is None]

    def _log(self, rank):
        f = self._logs.get(rank)
        if f is None:
            f = self._logs[rank] = open(self.log_path(rank), "a", encoding="utf-8", errors="replace")
        return f

    def _handle(self, event):
        try:
            self._apply(event)
        except (TypeError, ValueError, AttributeError, KeyError):
            # a well-formed frame with nonsense in it (only a holder of the run's token can send
            # one): dropped and counted like a malformed frame, never fatal to the run
            self.rejected_events += 1

    def _apply(self, event):
        rank = event.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < self.np:
            return
        r = self.ranks[rank]
        r.last_event = time.monotonic()
        kind = event.get("t")
        if kind == "lines":
            lines = [str(x) for x in event.get("lines", [])]
            f = self._log(rank)
            f.write("".join(line + "\n" for line in lines))
            r.lines += len(lines)
            if lines:
                r.last_line = lines[-1].rsplit("\r", 1)[-1]
        elif kind == "state":
            if event.get("state") == "starting" and r.pid is not None and event.get("pid") != r.pid:
                self._retried(rank)
            r.state = str(event.get("state", r.state))
            for key in ("host", "local_rank", "pid", "gpus", "executor", "partition"):
                if key in event:
                    setattr(r, key, event[key])
        elif kind == "progress":
            r.step, r.total = event.get("step"), event.get("total")
            if isinstance(event.get("metrics"), dict):
                r.metrics.update(event["metrics"])
        elif kind == "rendezvous" and rank == 0:
            # task 0's rendezvous server is up: every other task needs its port
            self._server.announce({"t": "rendezvous", "port": int(event["port"])})
        elif kind == "file" and event.get("kind") in FILE_KINDS:
            self._receive_file(event)
        elif kind == "blocked":
            seconds = event.get("seconds")
            r.blocked_since = time.monotonic() - (seconds if isinstance(seconds, (int, float)) else 0)
        elif kind == "unblocked":
            r.blocked_since = None
        elif kind == "exit":
            r.blocked_since = None
            r.exit = {k: event.get(k) for k in ("code", "status", "summary")}
            r.ended_at = time.monotonic()
            status = event.get("status")
            r.state = {"ok": "done", "stopped": "cancelled"}.get(status, "failed")
            if status not in ("ok", "stopped"):
                self._failures.append(dict(event.get("summary") or {}, rank=rank, status=status))
        if self.view is not None:
            self.view.event(self, rank, event)

    def _retried(self, rank):
        """A second start of a rank: Spark re-attempted the barrier stage after a failure."""
        if self.allow_retry:
            return
        if self._retry is None:
            self._retry = {"rank": rank, "earlier": [dict(f) for f in self._failures]}
        self._request_stop("retried")

    def _receive_file(self, event):
        """Append a chunk of a file a task sent (rank 0's timeline) to the run folder."""
        name = FILE_KINDS[event["kind"]]
        partial = os.path.join(self.run_dir, name + ".part")
        if event.get("seq") == 0 and os.path.exists(partial):
            os.remove(partial)
        with open(partial, "a", encoding="utf-8") as f:
            f.write(str(event.get("data", "")))
        if event.get("last"):
            self.files[event["kind"]] = partial

    # -- the end ------------------------------------------------------------------------------
    def _finish(self):
        import cloudpickle  # noqa: F401  (values may need it to unpickle)

        for f in self._logs.values():
            f.close()
        if "timeline" in self.files or os.path.exists(os.path.join(self.run_dir, "timeline.json.part")):
            from .timeline import finalize
            self.timeline_path = finalize(self.run_dir)
        outcomes = self.launcher.outcomes or []
        results = [None] * self.np
        infos = {}
        retried = None
        for rank, status, payload in outcomes:
            if status == "retried":
                retried = payload
                continue
            if status == "ok":
                # Spark's own task results: trusted like any Spark job's (never the event channel)
                value = pickle.loads(payload)
                if self.cell is not None:
                    value, exports = value
                    if rank == 0 and exports is not None:
                        self.exports = exports
                results[rank] = value
            else:
                infos[rank] = dict(payload, status=status)
        ok_ranks = {rank for rank, status, _ in outcomes if status == "ok"}
        for state in self.ranks:  # the final state from the outcomes, if no exit event came
            if state.rank in ok_ranks:
                state.state = "done"
            elif state.rank in infos:
                state.state = "cancelled" if infos[state.rank]["status"] == "stopped" else "failed"
        self.ended = time.time()
        self.error = self._error(infos, retried)
        if self.error is None:
            self.results = results
            self.state = "done"
        else:
            self.state = {"cancelled": "cancelled", "timeout": "timeout"}.get(self._stop_reason, "failed")
            for state in self.ranks:
                if state.state in ("pending", "starting", "rendezvous", "running"):
                    state.state = "cancelled"
        self._write_meta()
        if self.view is not None:
            self.view.finish(self)

    def _error(self, infos, retried):
        failures = [dict(infos.get(f["rank"], {}), **{k: v for k, v in f.items() if v is not None})
                    for f in self._failures]
        failures += [dict(i, rank=r) for r, i in sorted(infos.items())
                     if i["status"] not in ("stopped",) and r not in {f["rank"] for f in failures}]
        if self._retry is not None:
            return self._retry_error(infos)
        if self._stop_reason == "stalled":
            return RankError({"rank": None, "type": "Stall", "message": self.stall},
                             {r.rank: describe_end(infos[r.rank]) if r.rank in infos else r.state
                              for r in self.ranks}, run_id=self.id,
                             note="Stack dumps of the waiting ranks are in their logs: "
                                  + ", ".join(self.log_path(r.rank) for r in self.ranks))
        lost_task = self._lost_task_error()
        if failures and lost_task is not None and all(is_follow_on(f) for f in failures):
            # a task died with its executor, and the others only failed because its rank was
            # gone: the dead task is the cause
            return lost_task
        if failures:
            first = next((f for f in failures if not is_follow_on(f)), failures[0])
            first = dict(infos.get(first["rank"], {}), **first)
            if not first.get("traceback"):
                # died without a Python traceback (a signal, os._exit): its last words instead
                tail = self._log_tail(first["rank"])
                if tail:
                    first["traceback"] = f"last lines of rank {first['rank']}'s log:\n{tail}"
            if first.get("signal") == "SIGABRT" and _looks_like_rendezvous(first.get("traceback", "")):
                first["hint"] = (
                    f"Horovod aborted inside hvd.init(): the Gloo rendezvous failed (rendezvous "
                    f"server {first.get('rendezvous', '?')}, on rank 0's host). Check that every rank "
                    f"calls hvd.init(), that the executors can reach that address and each other "
                    f"on interface {first.get('iface', '?')} (HOROVOD_GLOO_IFACE), and that "
                    f"HOROVOD_GLOO_TIMEOUT_SECONDS covers the ranks' start-up.")
            others = {}
            for rank in range(self.np):
                if rank == first["rank"]:
                    continue
                if rank in infos:
                    others[rank] = describe_end(infos[rank])
                elif self.ranks[rank].state == "done":
                    others[rank] = "finished"
            return RankError(first, others, run_id=self.id)
        if retried is not None:
            return LaunchError(retried["message"])
        if self._stop_reason == "timeout":
            return RunTimeout(self._timeout_message())
        if self._stop_reason == "cancelled":
            return RunCancelled(f"run {self.id} was cancelled; every rank was stopped.")
        if self.launcher.error is not None:
            return lost_task or self.launcher.error
        if not self.launcher.outcomes or len(self.launcher.outcomes) != self.np:
            return LaunchError(f"run {self.id} ended without results from every rank.")
        return None

    def _lost_task_error(self):
        """A LaunchError naming the rank whose Spark task died without a word, if one did."""
        if not isinstance(self.launcher.error, LaunchError):
            return None
        lost = self._unended()
        failed = re.search(r"barrier task ResultTask\(\d+, (\d+)\)", str(self.launcher.error))
        # the task Spark names as the failed one, else the first without an ending
        lost.sort(key=lambda r: r.partition != (int(failed.group(1)) if failed else None))
        if not lost:
            return None
        r = lost[0]
        return LaunchError(
            f"the Spark task of rank {r.rank} on {r.host} (executor {r.executor}) died "
            f"before its rank ended (its Python worker or executor was killed); every "
            f"other rank was stopped. Spark aborts a barrier stage whose task fails and "
            f"hvd_magic does not re-attempt it, so training was not started over. "
            f"[{self.launcher.error}]")

    def _retry_error(self, infos):
        earlier = self._retry["earlier"]
        if earlier:
            first = next((f for f in earlier if not is_follow_on(f)), earlier[0])
            cause = f"rank {first['rank']} {describe_end(first)}"
        else:
            lost = [r.rank for r in self.ranks if r.exit is None]
            cause = (f"the task of rank {lost[0] if lost else self._retry['rank']} died (its Python "
                     "worker or executor exited)")
        return LaunchError(
            f"Spark re-attempted the barrier stage after a failure ({cause}); hvd_magic stopped "
            "the new attempt rather than start training over silently. Fix the failure, or pass "
            "--retries N to allow re-attempts.")

    def _log_tail(self, rank, lines=40):
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

    def _timeout_message(self):
        lines = [f"run {self.id} reached its --timeout of {self.timeout:g} s; every rank was stopped."]
        for r in self.ranks:
            progress = f" step {r.step}/{r.total}" if r.step is not None else ""
            lines.append(f"  rank {r.rank}:{progress} last line: {r.last_line!r}")
        return "\n".join(lines)

    def _write_meta(self):
        meta = {"id": self.id, "np": self.np, "state": self.state, "where": self.where,
                "started": self.started, "ended": self.ended, "name": self.name,
                "ranks": [r.as_dict() for r in self.ranks]}
        tmp = os.path.join(self.run_dir, "run.json.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1, default=str)
        os.replace(tmp, os.path.join(self.run_dir, "run.json"))


def _looks_like_rendezvous(text):
    return any(word in text for word in ("gloo", "Gloo", "rendezvous", "HTTPStore", "Timed out"))


def _bind_host(launcher):
    """Listen where the executors reach the driver: Spark's own bind address when it has one,
    loopback for a local driver, else every interface."""
    bind = getattr(launcher, "bind_address", None)
    if bind:
        return bind
    host = launcher.driver_host
    return host if host.startswith("127.") or host == "localhost" else "0.0.0.0"


def make_launcher(np, spark=None, master=None, spark_conf=None):
    if np < 0:
        from .local import LocalLauncher
        return LocalLauncher()
    from .spark import SparkLauncher
    return SparkLauncher(session=spark, master=master, conf=spark_conf)


def check_np(np):
    if isinstance(np, bool) or not isinstance(np, int) or np == 0:
        raise UsageError(f"np must be a non-zero whole number (N ranks on Spark, -N for N ranks on "
                         f"the driver only), not {np!r}.")
    return np


def run(fn, np=2, args=(), kwargs=None, *, spark=None, master=None, spark_conf=None,
        timeout=None, run_dir=None, view=None, background=False, horovod_env=None, env=None,
        broadcast_bytes=DEFAULT_BROADCAST_BYTES, retries=0, name=None, timeline=False,
        stall_timeout=DEFAULT_STALL_TIMEOUT, on_stall="warn"):
    """Run `fn(*args, **kwargs)` on `np` Horovod ranks; return the finished `Run`.

    `np` > 0 runs N ranks as one Spark barrier stage (the active SparkSession, or an embedded
    ``local[N]`` one); `np` < 0 runs -np ranks as processes of this machine, without Spark.
    Raises `RankError` with the first failing rank's traceback; `UsageError` for bad arguments.

    Examples
    --------
    >>> def total():
    ...     import torch, horovod.torch as hvd
    ...     hvd.init()
    ...     return hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
    >>> hvd_magic.run(total, np=2).results
    [3.0, 3.0]
    """
    check_np(np)
    if not callable(fn):
        raise UsageError(f"fn must be callable, not {type(fn).__name__}.")
    values = {f"argument {i}": a for i, a in enumerate(args)}
    values.update({f"keyword {k}": v for k, v in (kwargs or {}).items()})
    pickled = pickle_values({"the function": fn, **values}, kind="value")
    job = {"fn": pickled["the function"], "args": [pickled[f"argument {i}"] for i in range(len(args))],
           "sources": {}}
    kwargs_pickled = {k: pickled[f"keyword {k}"] for k in (kwargs or {})}
    return launch(job, kwargs_pickled, np, spark=spark, master=master, spark_conf=spark_conf,
                  timeout=timeout, run_dir=run_dir, view=view, background=background,
                  horovod_env=horovod_env, env=env, broadcast_bytes=broadcast_bytes,
                  retries=retries, name=name, timeline=timeline, stall_timeout=stall_timeout,
                  on_stall=on_stall)


def run_cell(cell_fn, np, **options):
    """Run a captured cell (`hvd_magic.capture.CellFunction`) on `np` ranks; see `run`."""
    import cloudpickle

    pickled = pickle_values(dict(cell_fn.values))
    job = {"fn": cloudpickle.dumps(cell_fn.fn), "args": [], "sources": cell_fn.sources,
           "cell": True, "export": list(cell_fn.export)}
    return launch(job, pickled, np, cell=cell_fn, **options)


def launch(job, kwargs_pickled, np, *, spark=None, master=None, spark_conf=None, timeout=None,
           run_dir=None, view=None, background=False, horovod_env=None, env=None,
           broadcast_bytes=DEFAULT_BROADCAST_BYTES, retries=0, name=None, cell=None,
           timeline=False, stall_timeout=DEFAULT_STALL_TIMEOUT, on_stall="warn",
           run_root="hvd_runs"):
    launcher = make_launcher(np, spark=spark, master=master, spark_conf=spark_conf)
    run_ = Run(abs(np), run_dir=run_dir, launcher=launcher, view=view, timeout=timeout, cell=cell,
               horovod_env=horovod_env, extra_env=env, broadcast_bytes=broadcast_bytes,
               allow_retry=retries > 0, name=name, timeline=timeline,
               stall_timeout=stall_timeout, on_stall=on_stall, run_root=run_root)
    return run_.launch(job, kwargs_pickled, background=background)
