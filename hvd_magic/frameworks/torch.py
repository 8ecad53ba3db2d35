"""torch.distributed's part of a rank's start: the variables torchrun gives its workers, so that
``dist.init_process_group("gloo")`` with no other argument (``env://``), DDP, Lightning and
accelerate find the launched world; and Gloo's interface (``GLOO_SOCKET_IFNAME``), which
torchrun leaves to Gloo's guess from the host's name.

Rank 0's own ``init_process_group`` hosts the store (a `TCPStore` on ``MASTER_PORT``), as under
torchrun without an agent store: it is made afresh with each process group. No port race: task 0
binds the port first (`serve`) and keeps it bound, not listening, for the whole launch, with
``SO_REUSEADDR``; no other process can take it (a plain bind is refused, and the kernel never
hands a bound port out as an ephemeral one), while the store, which binds with ``SO_REUSEADDR``
too, can. Nothing here imports torch: a cell that never imports it pays two sockets.

Two ports are held, named in ``HVD_MAGIC_TORCH_PORTS``: a group destroyed and made again in
one cell (``dist.destroy_process_group(); dist.init_process_group("gloo")``) would otherwise let
a fast rank find rank 0's old store, not yet destroyed, and read the old group's addresses there
(its Gloo fails; rank 0's new store waits for it until its timeout). Each destroy of the
default group moves ``MASTER_PORT`` to the other port (`hvd_magic.rank.torch_store`), so every
new group's store is on a port where the old one never was.
"""


from ..rank import sockets
from ..rank.torch_store import PORTS
from .base import Framework, Served, iface_towards


class TorchDistributed(Framework):
    name = "torch"

    def serve(self):
        reserved = [sockets.reserve(), sockets.reserve()]
        return Served({"ports": [s.getsockname()[1] for s in reserved]},
                      lambda: [s.close() for s in reserved])

    def rank_env(self, slot, world, relayed):
        return {
            "MASTER_ADDR": world.address,
            "MASTER_PORT": relayed["ports"][0],
            PORTS: ",".join(map(str, relayed["ports"])),
            "RANK": slot.rank,
            "WORLD_SIZE": world.size,
            "LOCAL_RANK": slot.local_rank,
            "LOCAL_WORLD_SIZE": slot.local_size,
            "GROUP_RANK": world.host_index(slot.hostname),
            "GROUP_WORLD_SIZE": world.host_count,
            "ROLE_NAME": "default",
            "ROLE_RANK": slot.rank,
            "ROLE_WORLD_SIZE": world.size,
            "TORCHELASTIC_RUN_ID": world.run_id,
            "TORCHELASTIC_RESTART_COUNT": 0,
            "TORCHELASTIC_MAX_RESTARTS": 0,
            # rank 0's init_process_group hosts the store: no agent's store is served
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            # Gloo's pairs on the interface towards rank 0's host, not the host name's address
            "GLOO_SOCKET_IFNAME": iface_towards(world.address),
        }

    def here(self, env):
        address = env.get("MASTER_ADDR")
        return {"GLOO_SOCKET_IFNAME": iface_towards(address)} if address else {}
