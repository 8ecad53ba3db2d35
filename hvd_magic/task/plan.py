"""The slots of a launch, derived by every task from the executors' addresses alone: each task's
rank, local rank and cross rank, numbered as Horovod numbers them (`tests/test_plan.py` checks
the two agree where Horovod is installed), so the same plan serves Horovod, torch.distributed and
tf.distribute without Horovod installed. No task needs to hear from another to compute it; also
the network helpers a task needs to reach the others."""

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """One rank's place: ranks run host by host (a host's ranks consecutive), `local_rank`
    counts within the host, `cross_rank` counts the hosts that have a rank at this local rank."""
    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def assign_slots(counts):
    """The slots for `counts`, ``[(host, slots there), ...]`` in host order."""
    size = sum(n for _, n in counts)
    # at local rank i: the hosts that have one, in host order
    across = {}
    for host, n in counts:
        for local_rank in range(n):
            across.setdefault(local_rank, []).append(host)
    slots, rank = [], 0
    for host, n in counts:
        for local_rank in range(n):
            slots.append(Slot(host, rank, local_rank, across[local_rank].index(host), size, n,
                              len(across[local_rank])))
            rank += 1
    return slots


def host_plan(hosts):
    """The slots for tasks whose hosts are `hosts` (one entry per partition, in order).

    Returns ``(plan, slots)``: the plan in rank order, and one slot per partition. Tasks on the
    same host get consecutive local ranks in partition order; hosts are ordered by their first
    partition.
    """
    order = list(dict.fromkeys(hosts))
    plan = assign_slots([(h, hosts.count(h)) for h in order])
    by_host = {h: iter([s for s in plan if s.hostname == h]) for h in order}
    return plan, [next(by_host[h]) for h in hosts]


def machine_name():
    """What tells this machine from the cluster's others: the address Spark was told to use
    here (SPARK_LOCAL_IP: one machine may hold workers on their own addresses, as the tests'
    cluster does), else the host name."""
    import os
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()


def _resolve(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _local_ip_towards(ip):
    """The address of this machine that packets to `ip` leave from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _iface_of(ip):
    import psutil
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return "lo"
