"""Horovod's elastic driver's log lines go to the run folder's ``elastic.log``, not under the cell.

Horovod's elastic driver and its rendezvous server (`horovod.runner.elastic`,
`horovod.runner.http`) log with the module-level functions (``logging.error(...)``), that is on
the root logger itself. With no handler on the root logger, the first such call runs
`logging.basicConfig()`: ``ERROR:root:failure count == 2 -> stop running`` then shows under the
cell after every Cancel, timeout or cell error of an elastic run (Horovod counts the workers we
stop as failed), and every library's warnings go to stderr for the rest of the kernel's life.

For an elastic run's duration `HorovodLog` is a filter on the root logger: a record logged from
Horovod's runner package is written to ``elastic.log`` and reaches no other handler; every other
record passes as before. A `NullHandler` on the root logger (only while it has no handler) keeps
`basicConfig` from running. Only what the root logger's level lets through arrives (WARNING and
up, unless the notebook lowered it): Horovod logs on the root logger itself, so its INFO lines
cannot be let in without letting in every library's. With two elastic runs at once, Horovod's
lines go to the first one's log (they do not say which driver they are from).

Not for: the ranks' own output (their logs: `hvd_magic.driver.folder`).
"""

import logging
import os

HOROVOD_RUNNER = os.sep + os.path.join("horovod", "runner") + os.sep


class HorovodLog(logging.Filter):
    """`start()` before Horovod's driver starts, `stop()` once it has ended."""

    def __init__(self, run_dir):
        super().__init__()
        self.path = os.path.join(run_dir, "elastic.log")
        # delay: no empty file in a run where Horovod said nothing worth a line
        self._file = logging.FileHandler(self.path, delay=True, encoding="utf-8")
        self._file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self._null = None

    def start(self):
        root = logging.getLogger()
        if not root.handlers:
            self._null = logging.NullHandler()
            root.addHandler(self._null)
        root.addFilter(self)
        return self

    def stop(self):
        root = logging.getLogger()
        root.removeFilter(self)
        if self._null is not None:
            root.removeHandler(self._null)
            self._null = None
        self._file.close()

    def filter(self, record):
        if HOROVOD_RUNNER not in record.pathname:
            return True
        self._file.handle(record)
        return False  # (a logger's filter: no handler of the root logger sees it)
