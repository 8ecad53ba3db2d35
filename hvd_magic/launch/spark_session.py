"""The SparkSession a classic launch runs on, when the user gave none: the active one, or the
embedded one, with room for the run's ranks.

The embedded session is adopted from the start `%load_ext` began (`prestart`) where it is the
one this run asks for and big enough (else that start is given up at once), or started here
(`sparkstart.SparkStart`); one of ours that is running but too small for the run is stopped and a
bigger one started. While it waits, a Cancel from another thread ends the start and nothing of
it is left running.

Not for: checking the session's slots or launching on it (`hvd_magic.launch.spark`), or the
JVM's start itself (`hvd_magic.launch.sparkstart`).
"""

from .prestart import adopt as adopt_prestart
from .sparkstart import (EMBEDDED_MARK, SparkStart, _active_context, _quiet, context_conf,
                         embedded_settings, local_slots)


class SessionFinder:
    """Finds or starts the session for a run of `np` ranks (`find`). `phase(words)` is told what
    it waits on; `shared_cores(master, np)` where the ranks will share this machine's cores."""

    def __init__(self, master=None, conf=None, log_dir="hvd_runs", verbose=False, *, phase,
                 shared_cores):
        self.master = master
        self.conf = conf or {}
        self.log_dir = log_dir        # where a JVM we start writes its log (spark-<time>.log)
        self.verbose = verbose        # the JVM's output shown in the cell too
        self.log_path = None          # that log, when this run started the JVM
        self.started_here = False     # the session was started for this run (in another thread)
        self._phase, self._shared_cores = phase, shared_cores
        self._cancelled = False
        self._starting = None         # the SparkStart under way, while `find` waits on it
        self._too_small = ""          # why the session begun at load was not used, said once

    def find(self, np):
        """The session: the one begun at load, the active one, or a new one with room for `np`."""
        from pyspark.sql import SparkSession

        self._adopt_prestart(np)
        if _active_context() is None:
            return self._start(np, self.master)
        session = SparkSession.builder.getOrCreate()
        ours = context_conf(session.sparkContext).get(EMBEDDED_MARK) == "true"
        slots = local_slots(session.sparkContext.master)
        if ours and slots is not None and slots < np and self.master is None:
            self._phase(f"stopping Spark ({session.sparkContext.master}: room for "
                        f"{slots} ranks) to start one with room for {np}")
            session.stop()  # ours and too small: start a bigger one
            session = self._start(np, None)
        return session

    def cancel(self):
        """Called from another thread while `find` runs: end the start it waits on."""
        self._cancelled = True
        starting = self._starting
        if starting is not None:
            starting.cancel()

    def _adopt_prestart(self, np):
        """Wait for the session the extension began starting when it loaded, and keep it."""
        start = adopt_prestart()
        if start is None:
            return
        if self.master is not None or start.conf != dict(self.conf):
            start.cancel()  # not the session this run asks for
            return
        slots = local_slots(start.master)
        if slots is not None and slots // int(self.conf.get("spark.task.cpus") or 1) < np:
            start.give_up()  # at once (a JVM on its way up ends itself); said once, in the phase
            self._too_small = f"; the {start.master} begun when hvd_magic loaded is too small"
            return
        self._shared_cores(start.master, np)
        if start.wait(0) is None:
            self._phase(f"starting Spark ({start.master}), begun when hvd_magic loaded")
        self._starting = start.start
        if self._cancelled:
            start.start.cancel()
        try:
            session = start.wait()
        finally:
            self._starting = None
        if self._cancelled:
            start.cancel()
            raise start.start.cancelled_error()
        if session is not None:  # (else it failed: the run starts its own, and says why)
            self.started_here = True  # (no second note on shared cores)
            self.log_path = start.start.log_path

    def _start(self, np, master):
        settings = embedded_settings(np, self.conf, master)
        self._starting = SparkStart(settings, self.log_dir, self.verbose)
        if self._cancelled:
            self._starting.cancel()
        slots = local_slots(settings["spark.master"])
        self._shared_cores(settings["spark.master"], np)  # before the wait, not after
        room = f": room for {slots} ranks" if slots is not None else ""
        self._phase(f"starting Spark ({settings['spark.master']}{room}){self._too_small}")
        self.started_here = True
        try:
            return _quiet(self._starting.session())
        finally:
            self.log_path = self._starting.log_path or self.log_path
            self._starting = None
