"""The launcher contract: what the driver needs from anything that starts ranks.

A launcher starts N tasks, each running `hvd_magic.task.run_task(settings, coordinator)` (which
spawns one rank process and streams its events to the driver's event server), and reports how
they ended. The driver loop (`hvd_magic.driver.loop`) owns everything else: events, logs, views,
stopping ranks, results and errors. A new launcher (a warm session, DataFrame shards, Spark
Connect) subclasses `Launcher` and implements `start`; nothing else has to change.

Calls, in the order the driver makes them::

    launcher.prepare(np)            # find or start resources; UsageError if N ranks cannot fit
    launcher.use_data(df, np)       # (--data) check a DataFrame, plan the ranks' shards
    ref = launcher.share(data)      # a large pickled value, once per executor (task: ref.value)
    channel = launcher.open_channel()  # where the tasks' events arrive (an EventServer)
    launcher.start(settings, np)    # start N tasks in the background; returns at once
    launcher.done() / join(t)       # have all tasks ended?
    launcher.cancel()               # last resort when tasks ignore the driver's stop message
    launcher.outcomes, .error       # how it ended: [(rank, status, payload)] or an exception
    launcher.late_events            # what tasks that could not reach the driver would have sent

and, read by the driver: `where` (shown to the user), `driver_host` (how tasks reach the driver's
event server) and `bind_host` (where that server listens).

`prepare` may be slow (starting Spark, waiting for executors). The driver runs it in a helper
thread and meanwhile shows `phase` ("starting Spark (local[4])"; None when there is nothing to
wait on), which a launcher sets with `_set_phase`; a Cancel or an interrupt then calls `cancel()`,
and `prepare` undoes what it started and raises `RunCancelled`.
"""

import os
import threading
import time

from .. import payload
from ..event_server import EventServer


class Launcher:
    where = "?"                   # shown to the user: "local[4]", "spark://…", "driver only"
    driver_host = "127.0.0.1"     # the address tasks connect to for the event channel
    data = None                   # the plan the ranks read a --data DataFrame by (`use_data`)
    executor_cores = None         # cores an executor has for ranks; None: its host's usable cores
    wants = None                  # (the job's imports, --ship): what a cluster's executors get
    shipment = ()                 # what they got: `hvd_magic.task.shipped.Parcel`s (prepare)
    error_loses_ranks = True      # an `error` means tasks died under their ranks (not so in a
    # session, whose ranks outlive a cell: there it says which ranks ignored the interrupt)
    orphans_heed_stop = True      # a rank unended once the tasks are done may still end if its
    # task is told again (Spark gave up on the task, not its Python worker); not in a session,
    # whose tasks repeat the interrupt until the cell ends: a second stop would only be waited on

    def __init__(self):
        self.phase = None         # what prepare() waits on now, in words; None: nothing slow
        self.phase_since = None   # time.monotonic() when that phase began
        self.outcomes = None      # [(rank, status, payload)] once every task ended
        self.error = None         # an exception that ended the tasks before they could report
        self.late_events = []     # events of tasks that could not reach the driver live
        self.notes = []           # what prepare() tells the user in passing (the run shows them)
        self._threads = []

    @property
    def bind_host(self):
        """Where the driver's event server listens: loopback for a local driver, else every
        interface (a launcher that knows better, e.g. Spark's bind address, says so)."""
        host = self.driver_host
        return host if host.startswith("127.") or host == "localhost" else "0.0.0.0"

    def prepare(self, np):
        """Make sure `np` ranks can run now; raise `UsageError` saying what to do if not."""

    def use_data(self, df, np, cache=None):
        """Plan how each of `np` ranks reads its rows of the DataFrame `df` (into `data`; `cache`:
        where a DataFrame that is not plain Parquet is converted to). UsageError saying why
        they cannot. Launchers without Spark's executors never get here:
        `hvd_magic.config.check_together` refuses ``--data`` for them first."""
        raise NotImplementedError(f"{type(self).__name__} cannot plan --data")

    def _set_phase(self, phase):
        if phase != self.phase:
            self.phase, self.phase_since = phase, time.monotonic()

    def _note(self, message):
        """A line for the user about this launch (not an error): the run's view shows it."""
        self.notes.append(message)

    def _note_cores(self, np, where):
        """More ranks than this machine has cores (`where`: "on local[4]"): say so (they run,
        slowly)."""
        cores = os.cpu_count() or 1
        if np > cores:
            self._note(f"{np} ranks {where} share this machine's {cores} CPU "
                       f"core{'s' if cores > 1 else ''}: about {cores / np:.2g} of a core each, "
                       f"so expect them to be slow.")

    def take_notes(self):
        """The notes not taken yet (the run hands them to its view, once each)."""
        notes, self.notes = getattr(self, "notes", []), []
        return notes

    def share(self, data):
        """A handle the tasks read a large value from (`.value`, or the bytes themselves)."""
        return payload.inband(data)

    def open_channel(self, sink=None):
        """The event channel of this launch: its tasks connect to it and send their events;
        the driver reads `.events` (or `sink` gets them) and answers with `announce`,
        `broadcast`, `stop_all`."""
        return EventServer(host=self.bind_host, sink=sink)

    def start(self, settings, np):
        """Start `np` tasks running `run_task(settings, coordinator)`; do not wait for them."""
        raise NotImplementedError

    def _in_background(self, target, name, *args):
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def done(self):
        return bool(self._threads) and not any(t.is_alive() for t in self._threads)

    def join(self, timeout=None):
        for t in self._threads:
            t.join(timeout)

    def cancel(self):
        """End every task now (the driver has already asked the ranks to stop). Also called from
        another thread while `prepare` runs: prepare then stops, undoes what it started and
        raises `RunCancelled`."""

    def job_ids(self):
        """Spark job ids of this launch (tests and the view), if any."""
        return []
