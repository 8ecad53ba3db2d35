"""The contract every framework's module keeps: what its ranks need served before they start,
and the variables each rank gets (the shape of Lightning's cluster environments and Ray Train's
backends, one step smaller).

A launch's task 0 (the first barrier task, or the first driver thread for ``--np -N``) calls
`Framework.serve` before any rank exists: whatever must be bound first (Horovod's rendezvous
server, torch's store port) is bound there, and what the others need of it (ports) is `relay`,
which the driver passes to every task as it passes Horovod's rendezvous port. Every task (task 0
too) calls `Framework.reserve` for what each rank must hold on its own host (TensorFlow's worker
port): the driver gathers every task's `relay` and, once all are in, passes them to every task in
rank order, as ``relayed["tasks"]`` beside task 0's served values. Each task then asks
`Framework.rank_env` for its rank's variables, from its slot, the `World` and the relayed values.

Not for: importing the framework itself (a cell that never imports torch must not pay for it),
IPython or pyspark (this runs in Spark tasks and on the rank side).
"""

from dataclasses import dataclass

from ..task.plan import _iface_of, _local_ip_towards


def iface_towards(address):
    """This host's network interface that packets to `address` leave from: the one a rank's
    Gloo should use (where the host's name resolves to a loopback address, as on many Debian
    machines, Gloo's own guess gives the peers an address they cannot reach)."""
    return _iface_of(_local_ip_towards(address))


@dataclass(frozen=True)
class World:
    """What every task knows of a launch: `size` ranks, `hosts` (the machine of each partition,
    in partition order: ranks are numbered host by host, hosts by their first partition), the
    run's id, and `address`, where task 0's host is reached from the others."""

    size: int
    hosts: tuple
    run_id: str
    address: str

    def host_index(self, hostname):
        """The index of `hostname` among the launch's machines (torchrun's ``GROUP_RANK``)."""
        return list(dict.fromkeys(self.hosts)).index(hostname)

    @property
    def host_count(self):
        return len(set(self.hosts))


class Served:
    """What a framework's `serve` started: `relay`, JSON values for every task, and `stop`."""

    def __init__(self, relay, stop=lambda: None):
        self.relay = relay
        self.stop = stop


class Framework:
    """One framework's part of starting a rank. Subclasses name themselves (`name`: the key of
    their relayed values) and make `rank_env`; `serve` and `here` are for those that need them."""

    name = ""

    def serve(self):
        """On task 0, before any rank starts: a `Served`, or None when nothing is served."""
        return None

    def reserve(self, slot):
        """On every task, before any rank starts: a `Served` whose `relay` is this task's own
        (gathered from every task and relayed to all as ``relayed["tasks"]``, in rank order),
        held until the task ends; or None when nothing is reserved per task."""
        return None

    def rank_env(self, slot, world, relayed):
        """The variables of `slot`'s rank (its rank, local rank, local size, cross rank, host
        name), given the `World` and what was relayed: task 0's `serve` values and, under
        ``"tasks"``, every task's `reserve` values by rank (a dict, empty if none)."""
        raise NotImplementedError

    def here(self, env):
        """Variables only the rank's own host can fill in, for a rank whose environment was made
        elsewhere (Horovod's elastic driver makes it on the notebook's side)."""
        return {}
