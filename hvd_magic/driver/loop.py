"""The driver loop of one run: events in, per-rank state, logs and view updates out.

It reads the run's `EventServer` queue until the launcher says every task ended, and:
- applies each event to the run (`hvd_magic.driver.apply`: logs, rank state, relays);
- stops every rank as soon as one fails (or a task fails before its rank starts), on interrupt,
  timeout or a stall (``--on-stall fail``),
  and cancels the launcher's tasks if they do not end after the stop request;
- at the end, gathers the values or the error (`hvd_magic.driver.ending`) and tells the view.

An exception of its own (a bug here or in the view: nothing a rank sent can cause one) stops
every rank and ends the run failed with an `InternalError` naming it, its traceback in
``events.jsonl``: a loop that died would leave the run "running" and its ranks unminded.
"""

import queue
import threading
import time
import traceback

from .. import payload
from ..errors import InternalError, RunCancelled
from ..task.stopping import STOP_GRACE_SECONDS
from .apply import apply_event
from .debugger import console, pause
from .ending import end_failed, finish, offline_message
from .folder import FLUSH_EVERY
from .watchdog import stall_message

KEEP_STACKS = ("cancelled", "timeout", "stalled")  # stops whose ranks' stacks are kept


class Driver:
    META_EVERY = 1.0  # seconds between rewrites of run.json while ranks change state

    def __init__(self, run):
        self.run = run
        self._stop_sent = None
        self._meta_due = None        # when run.json should be rewritten, if something changed
        self._flushed = time.monotonic()
        self._internal = None        # the InternalError the run ends with, if a bug struck
        self._stall_stacks = None    # the stacks request a stall's report waits for
        self.thread = None           # the thread that runs the loop

    def drive(self):
        run = self.run
        self.thread = threading.get_ident()
        try:
            if run.stop_reason is not None:  # a Cancel between prepare's end and the launch
                self._send_stop()
            deadline = None if not run.timeout else run.started + run.timeout
            held_since = None  # since when a rank is held in pdb (driver/debugger.py)
            while not run.launcher.done():
                # Once every rank has said it exited, only the tasks' ends are awaited: look
                # often, not every 0.1 s (a trivial cell's run would end up to 0.1 s late).
                self._pump(0.005 if all(r.exit is not None for r in run.ranks) else 0.1)
                if run.held():  # a person debugs: no timeout, no stall meanwhile
                    held_since = held_since or time.monotonic()
                    if not run.background and run.stop_reason is None:
                        console(run)  # the cell's own notebook waits anyway: pdb opens here
                elif held_since is not None:
                    paused, held_since = pause(run, held_since), None
                    deadline = deadline and deadline + paused
                # a rank failed, or a task ended in an error before its rank could say anything
                # (its peers would wait for it in their rendezvous)
                if (run.failures or run.launcher.error is not None) and run.stop_reason is None:
                    self.request_stop("failed")
                if deadline is not None and time.time() > deadline and run.stop_reason is None \
                        and held_since is None:
                    self.request_stop("timeout")
                self._watch_for_stall()
                if run.elastic is not None and run.stop_reason is None and not run.held():
                    run.elastic.give_up_frozen(run)  # (driver/frozen.py)
                self._escalate()
                if time.monotonic() - self._flushed >= FLUSH_EVERY:
                    self._flushed = time.monotonic()
                    run.folder.flush()
                if self._meta_due is not None and time.monotonic() >= self._meta_due:
                    self._meta_due = None
                    run.folder.write_meta(run)
                if run.view is not None:
                    run.view.tick(run)
        except KeyboardInterrupt:
            self.request_stop("cancelled")
            self._wait_stopped()
        except Exception as exc:  # a bug of ours: stop the ranks, then end the run with it
            self._internal_error(exc, "minding the run")
            self._wait_stopped()
        finally:
            try:
                self._drain()
                self._finish()
            finally:
                for ref in run._shared.values():  # the ranks are gone: their values' files too
                    payload.release(ref)
                if run.elastic is not None:
                    run.elastic.end()
                run.held().clear()  # (every rank ended: none is held, whatever it last said)
                run._done.set()
                run.show_end()
        if run.error is not None:
            raise run.error

    # -- stopping -----------------------------------------------------------------------------
    def request_stop(self, reason):
        run = self.run
        if run.stop_reason is not None:
            return
        run.stop_reason = reason
        if reason in KEEP_STACKS and run._server is not None:
            try:  # where the ranks were, in the run folder's stacks.txt (at most 2 s)
                run.keep_stacks()
            except (KeyboardInterrupt, OSError):  # a second interrupt: stop now
                pass
        self._send_stop()

    def _send_stop(self):
        """Tell the tasks to stop (once the event server exists: a Cancel may come earlier)."""
        run = self.run
        if run._server is not None and self._stop_sent is None:
            self._stop_sent = time.monotonic()
            run.release_held()  # (a held rank's pdb ignores an interrupt)
            run._server.stop_all(run.stop_reason)

    def _watch_for_stall(self):
        run = self.run
        if self._stall_stacks is not None:  # the report waits (at most 2 s) for the stacks
            if self._stall_stacks.complete():
                self._report_stall(run.wait_stacks(self._stall_stacks))
            return
        if run.stall_timeout is None or run.stop_reason is not None or run.stall is not None \
                or run.held():
            return
        ranks = run.ranks if run.elastic is None else run.elastic.watched(run.ranks)
        run.stall = stall_message(ranks, run.stall_timeout)
        if run.stall is not None:
            self._stall_stacks = run.ask_stacks()

    def _report_stall(self, stacks):
        """The watchdog's message with every rank's stack, grouped (also in stacks.txt)."""
        run = self.run
        self._stall_stacks = None
        run.stall = f"{run.stall}\n{stacks.text()}"
        try:
            run.keep_stacks(stacks)
        except OSError:
            pass
        run.folder.record({"t": "stall", "message": run.stall})
        # A stall that fails the run is said once, by its error (`RunStalled`); meanwhile the
        # view says only that the run stops for it.
        notice = run.stall if run.on_stall != "fail" else \
            "stall: every rank is stopped (--on-stall fail); the error says where each one was"
        if run.view is not None:
            run.view.event(run, None, {"t": "stall", "message": notice})
        if run.on_stall == "fail":
            self.request_stop("stalled")

    def _escalate(self):
        """Tasks that did not end after the stop request: cancel the launcher's tasks."""
        if self._stop_sent is not None and time.monotonic() - self._stop_sent > STOP_GRACE_SECONDS + 2:
            self.run.launcher.cancel()

    def _wait_stopped(self):
        launcher = self.run.launcher
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 10
        while not launcher.done() and time.monotonic() < deadline:
            try:
                self._pump(0.1)
                self._escalate()
            except KeyboardInterrupt:  # a second interrupt: stop waiting politely
                launcher.cancel()
        launcher.join(timeout=5)

    # -- events -------------------------------------------------------------------------------
    def _pump(self, timeout):
        """Apply the events waiting (the first waited for at most `timeout` s); how many."""
        events, taken = self.run._server.events, 0
        try:
            event = events.get(timeout=timeout)
            while True:  # then everything already waiting, without blocking
                self._handle(event)
                taken += 1
                event = events.get_nowait()
        except queue.Empty:
            return taken

    def _drain(self):
        run = self.run
        if run._server is None:
            return
        run.launcher.join(timeout=5)
        to_end = hasattr(run._server, "wait_read")  # (a warm session's channel stays open)
        if to_end:  # first: a stop sent to a task that closed its end resets the connection,
            read_to_end(run._server, self._pump)  # dropping its events not read yet
        self._stop_orphans()
        if to_end:
            read_to_end(run._server, self._pump)
        run._server.close()
        while True:
            try:
                self._handle(run._server.events.get_nowait())
            except queue.Empty:
                break
        run.rejected_frames = run._server.rejected

    def _stop_orphans(self):
        """The launcher is done but some ranks never said they ended: Spark gave up on their
        tasks without killing the Python workers. Tell those tasks to stop their ranks, and wait
        for them to say so."""
        run = self.run
        if not run.unended() or not run.launcher.orphans_heed_stop:
            return
        run._server.stop_all(run.stop_reason or "failed")
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 2
        while run.unended() and time.monotonic() < deadline:
            self._pump(0.1)

    def _handle(self, event):
        try:
            if apply_event(self.run, event, self.request_stop) and self._meta_due is None:
                self._meta_due = time.monotonic() + self.META_EVERY
        except (TypeError, ValueError, AttributeError, KeyError):
            # a well-formed frame with nonsense in it (only a holder of the run's token can send
            # one): dropped and counted like a malformed frame, never fatal to the run
            self.run.rejected_events += 1
        except Exception as exc:  # a bug of ours or the view's, not the sender's: stop the run
            self._internal_error(exc, f"applying rank {event.get('rank')}'s {event.get('t')!r} event")

    def _internal_error(self, exc, doing):
        """Stop every rank; the run ends failed with the first such error (the later ones are
        usually the same bug met again while the ranks stop)."""
        self._keep_internal(exc, doing)
        self.request_stop("internal")

    def _keep_internal(self, exc, doing):
        run = self.run
        if self._internal is None:
            self._internal = InternalError(
                f"hvd_magic failed while {doing}: {type(exc).__name__}: {exc}. Every rank was "
                f"stopped. This is a bug in hvd_magic (or in the view given to it): please report "
                f"it with the traceback recorded in {run.run_dir}/events.jsonl.")
            try:
                run.folder.record({"t": "internal", "message": str(self._internal),
                                   "traceback": traceback.format_exc()})
            except (OSError, ValueError, AttributeError):  # the folder is closed or not made
                pass

    # -- the end ------------------------------------------------------------------------------
    def _apply_late_events(self):
        """Events of tasks that could not reach the driver: they came back with the outcomes."""
        events = list(getattr(self.run.launcher, "late_events", None) or ())
        message = offline_message(events)
        if message and self.run.view is not None:
            self.run.view.event(self.run, None, {"t": "offline", "message": message})
        for event in events:
            self._handle(event)

    def _finish(self):
        self._apply_late_events()
        try:
            finish(self.run, self._internal)
        except KeyboardInterrupt:  # while the values were read (a large one takes seconds)
            self.run.stop_reason = self.run.stop_reason or "cancelled"
            end_failed(self.run, RunCancelled(
                f"run {self.run.id} was cancelled while its values were read; every rank had "
                f"ended."), internal=False)
        except Exception as exc:  # a bug of ours at the very end: the run ends all the same
            self._keep_internal(exc, "ending the run")  # (every rank ended: none to stop)
            end_failed(self.run, self._internal)


def read_to_end(server, pump, limit=30.0):
    """The tasks' last events, before the sockets close (a task closes its connection once its
    rank ended), applied by `pump` as they are read: the server's queue is bounded and its reader
    waits for room, so a backlog left in the sockets takes as long as it takes to apply. Given up
    on after 2 s without an event (a connection open and quiet), or `limit` s in all (a rank that
    Spark left running and that prints on: `_stop_orphans` stops it)."""
    now = time.monotonic()
    quiet_until, end = now + 2, now + limit
    while not server.wait_read(timeout=0) and time.monotonic() < end:
        if pump(0.05):
            quiet_until = time.monotonic() + 2
        elif time.monotonic() > quiet_until:
            return
