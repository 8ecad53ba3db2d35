"""Horovod's part of a rank's start: task 0 serves the Gloo rendezvous (`horovod_rendezvous`),
every rank gets Horovod's slot variables and the rendezvous' address, and its network interface
towards it (found on the rank's own host). The rendezvous only where Horovod is installed
(on task 0's Python): elsewhere no rank could use it."""

from ..needs import installed
from .base import Framework, Served, iface_towards


def horovod_rank_env(slot, np, rendezvous_ip=None, rendezvous_port=None, iface=None):
    """A slot's Horovod variables; with the rendezvous' address where it is served. The slot's
    own (HOROVOD_RANK...) are every rank's identity, Horovod installed or not: hvd_magic's rank
    side reads them (a rank's --data share, the debugger's rank)."""
    env = {
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(np),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_HOSTNAME": slot.hostname,
    }
    if rendezvous_port is not None:
        env.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_ip,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
            "HOROVOD_GLOO_IFACE": iface,
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
        })
    return env


class Horovod(Framework):
    name = "horovod"

    def serve(self):
        if not installed("horovod"):
            return None
        from .horovod_rendezvous import Rendezvous
        rendezvous = Rendezvous()
        return Served({"port": rendezvous.port}, rendezvous.stop)

    def rank_env(self, slot, world, relayed):
        if "port" not in relayed:  # not served: Horovod is not installed
            return horovod_rank_env(slot, world.size)
        return horovod_rank_env(slot, world.size, world.address, relayed["port"],
                                iface_towards(world.address))

    def here(self, env):
        address = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        return {"HOROVOD_GLOO_IFACE": iface_towards(address)} if address else {}
