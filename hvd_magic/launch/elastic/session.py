"""The launch of an elastic warm session (``%horovod_session start --np 4 --min-np 2``, or
``--np -4`` on the driver): Horovod's elastic driver holding the session's rank processes, none
of them ever replaced.

It is an elastic run's launch (`ElasticSparkLauncher`, `ElasticLocalLauncher`: one host key per
slot, our rank processes as Horovod's workers, every ring told as a ``ring`` event) with one
difference: a lost slot gets no new process. A
replacement would start with an empty namespace and join only when the survivors reset Horovod,
so a session's later cells would run on ranks that lack what earlier cells defined there; the
session goes on with its survivors instead (`hvd_magic.driver.session`), and ends, saying why,
when fewer than ``--min-np`` are left.

Not for: what the survivors do when a rank is lost (the session tells them to reset Horovod
before the next cell: `hvd_magic.rank.session.reset_horovod`).
"""

from .launcher import ElasticLocalLauncher
from .spark import ElasticSparkLauncher


class _Survivors:
    """What an elastic session's launch changes in an elastic run's (`ElasticLauncher`)."""

    def _replace_waiting(self):
        """Lost slots stay empty: the session goes on with the survivors."""

    def _create_worker(self, slot_info, events):
        """Horovod's `create_worker_fn`. A rank stopped with the session ends as a success: every
        worker failing is, to Horovod's driver, a failed job, which it logs as an error."""
        code, when = super()._create_worker(slot_info, events)
        return (0 if self._stopping else code), when


class ElasticSessionLauncher(_Survivors, ElasticLocalLauncher):
    """``--np -N --min-np M``: the ranks are processes of this machine."""


class ElasticSparkSessionLauncher(_Survivors, ElasticSparkLauncher):
    """``--np N --min-np M``: each rank in a plain Spark task of its own
    (`hvd_magic.launch.elastic.spark`); a lost executor's ranks are lost ranks."""
