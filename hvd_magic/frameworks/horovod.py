"""Horovod's part of a rank's start: task 0 serves the Gloo rendezvous (`horovod_rendezvous`),
every rank gets Horovod's slot variables and the rendezvous' address, and its network interface
towards it (found on the rank's own host)."""

from .base import Framework, Served, iface_towards


def horovod_rank_env(slot, np, rendezvous_ip, rendezvous_port, iface):
    return {
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(np),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_ip,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_GLOO_IFACE": iface,
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }


class Horovod(Framework):
    name = "horovod"

    def serve(self):
        from .horovod_rendezvous import Rendezvous
        rendezvous = Rendezvous()
        return Served({"port": rendezvous.port}, rendezvous.stop)

    def rank_env(self, slot, world, relayed):
        return horovod_rank_env(slot, world.size, world.address, relayed["port"],
                                iface_towards(world.address))

    def here(self, env):
        address = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        return {"HOROVOD_GLOO_IFACE": iface_towards(address)} if address else {}
