"""Horovod's own elastic pieces, each told to our launcher (`hvd_magic.launch.elastic.launcher`):

- `ring_rendezvous`: Horovod's rendezvous server; each ring it is given goes to the launcher,
  and Gloo's scopes become the machines' (`hvd_magic.launch.elastic.hosts`);
- `elastic_driver`: Horovod's `ElasticDriver`, saying while it waits for ``min_np`` slots and
  when it gives up (how long it waited, its timeout); its `stop` ends such a wait at once, and a
  worker's exit recorded after it ends quietly;
- `discovery`: the slots the launcher offers, as Horovod's host discovery.

Not for: what a slot is or when it is offered (the launcher's).
"""

import threading
import time

from ...compat import horovod as horovod_compat
from .hosts import placement


def ring_rendezvous(launcher):
    """Horovod's rendezvous server, telling `launcher` each ring it is given."""
    from horovod.runner.http.http_server import RendezvousServer

    class RingRendezvous(RendezvousServer):
        def init(self, host_alloc_plan):
            launcher._placed = placement(host_alloc_plan, launcher._machine_of)
            super().init(list(launcher._placed.values()))  # Gloo's scopes are the machines'
            launcher._ring_formed([s.hostname for s in host_alloc_plan])

    return RingRendezvous()


def elastic_driver(launcher, *args, **kwargs):
    """Horovod's elastic driver, telling `launcher` while it waits for `min_np` slots and when
    it gives up (the elastic timeout: how long it waited, and its timeout); its `stop` ends such
    a wait at once. (Private members of Horovod's driver: `hvd_magic.compat.horovod`.)"""
    from horovod.runner.common.util.timeout import TimeoutException
    from horovod.runner.elastic.driver import ElasticDriver

    horovod_compat.worker_exit_hook(ElasticDriver)  # (said once where it has none)

    class WaitingDriver(ElasticDriver):
        def wait_for_available_slots(self, min_num_proc, min_hosts=1):
            began = launcher._waiting_since = time.monotonic()
            try:
                return super().wait_for_available_slots(min_num_proc, min_hosts)
            except TimeoutException:
                waited = time.monotonic() - began
                launcher._gave_up_waiting(waited, horovod_compat.elastic_timeout(self) or waited)
                raise
            finally:
                launcher._waiting_since = None

        def stop(self, error_message=None):
            super().stop(error_message)
            horovod_compat.wake_slot_wait(self)  # (the wait sees the shutdown once woken)

        def _handle_worker_exit(self, slot_info, exit_code, timestamp):
            # A worker's exit is recorded in the registry's barrier, which our stop breaks
            # (`ElasticLauncher._stop_horovod_later`): the run is over, its thread ends quietly
            # rather than with a traceback on the notebook's stderr.
            try:
                super()._handle_worker_exit(slot_info, exit_code, timestamp)
            except threading.BrokenBarrierError:
                if not self.finished():
                    raise

    return WaitingDriver(*args, **kwargs)


def discovery(launcher):
    from horovod.runner.elastic.discovery import HostDiscovery

    class SlotDiscovery(HostDiscovery):
        def find_available_hosts_and_slots(self):
            return launcher._offered()

    return SlotDiscovery()
