"""A rank of Horovod's elastic run (``HOROVOD_ELASTIC=1``): of the driver's words on the
membership it takes ``lost`` alone (its ring is Horovod's to re-form), and the sockets its rings
made are cut, so that a wait on the dead peer (or on a survivor that left the ring) ends before
Gloo's timeout.

Which sockets are the rings': those ``hvd.init()`` opened (its Gloo contexts are connected
before it returns; the elastic reset calls it again for every new ring), noted by a wrapper put
in Horovod's ``mpi_ops`` as it is imported (`hvd_magic.rank.hooks`). The code's own connections
(an MLflow client, a database, a data stream) are never cut.

Not for: torch.distributed's elastic worlds (`hvd_magic.rank.elastic_world`).
"""

import functools
import sys
import threading
import time

from . import hooks, sockets

GRACE = 0.3  # seconds Horovod's ring may notice a loss by itself


class Ring:
    """The sockets this rank's Horovod rings made, and the driver's ``lost``."""

    def __init__(self):
        self.sockets = sockets.GroupSockets()

    def heard(self, message):
        """The driver's word (the probe's helper thread)."""
        if message.get("t") == "lost":
            self.cut_if_stuck()

    def cut_if_stuck(self, after=GRACE):
        """The rings' connections open now, cut `after` seconds from now if they are still
        open then (Horovod has not noticed the loss by itself) and Horovod is not inside
        ``hvd.init()`` (where a Gloo error aborts the process). A new ring's connections, made
        meanwhile, are never touched."""
        held = self.sockets.current()

        def later():
            time.sleep(after)
            if _horovod_ready():
                self.sockets.cut(held)

        threading.Thread(target=later, name="hvd-magic-cut", daemon=True).start()

    def install(self):
        """Note what every ``hvd.init()`` opens, once Horovod is imported."""
        for framework in ("torch", "tensorflow"):
            hooks.when_imported(f"horovod.{framework}.mpi_ops", self._wrap_init)

    def _wrap_init(self, mpi_ops):
        init = getattr(mpi_ops, "init", None)
        if init is None:
            return
        group = self.sockets

        @functools.wraps(init)
        def making_a_ring(*args, **kwargs):
            with group.making():
                return init(*args, **kwargs)

        hooks.replace(mpi_ops, {"init": making_a_ring})


def _horovod_ready():
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "is_initialized"):
            try:
                return bool(module.is_initialized())
            except Exception:  # noqa: BLE001
                return False
    return False
