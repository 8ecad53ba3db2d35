"""Horovod's plan for a launch, derived by every task from the executors' addresses alone:
each task's slot (rank, local rank, cross rank), the rank's Horovod environment, its network
interface and its GPUs. No task needs to hear from another to compute it."""

import socket


def host_plan(hosts, np):
    """Horovod slots for tasks whose hosts are `hosts` (one entry per partition, in order).

    Returns one slot per partition. Tasks on the same host get consecutive local ranks in
    partition order; hosts are ordered by their first partition.
    """
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    order = list(dict.fromkeys(hosts))
    counts = {h: hosts.count(h) for h in order}
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{counts[h]}" for h in order)), np)
    by_host = {h: [s for s in plan if s.hostname == h] for h in order}
    taken = {h: 0 for h in order}
    slots = []
    for h in hosts:
        slots.append(by_host[h][taken[h]])
        taken[h] += 1
    return plan, slots


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


def visible_devices(assigned, visible=None):
    """CUDA_VISIBLE_DEVICES for a rank given the GPU addresses Spark assigned its task.

    When the executor itself sees only some GPUs (its own CUDA_VISIBLE_DEVICES) and Spark's
    addresses are indices into that list, they are mapped through it; otherwise they are used as
    they are (discovery scripts usually report the ids CUDA itself uses).
    """
    assigned = [str(a).strip() for a in assigned]
    if not visible or not assigned:
        return assigned
    seen = [v.strip() for v in visible.split(",") if v.strip()]
    if all(a.isdigit() and int(a) < len(seen) for a in assigned) and \
            not all(a in seen for a in assigned):
        return [seen[int(a)] for a in assigned]
    return assigned

