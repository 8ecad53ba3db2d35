"""Simulated hosts for multi-host tests and benchmarks: network namespaces on one bridge.

`simulated_hosts(n)` makes a Linux bridge in this (root) network namespace holding the first
address of a private /24, and ``n - 1`` namespaces, each joined to the bridge by a veth pair and
holding the next addresses: ``n`` "machines" on one layer-2 segment, so any two reach each other
directly (no routing, no IP forwarding turned on here). Host 0 is the root namespace itself (the
master, the driver and the first worker run there). Names carry this process's id and the subnet
is one no interface or route uses yet, so parallel or leftover runs never collide. Everything made
is removed on the way out, also on failure, and every process still running in a namespace (a
worker's executor and its Python workers, started by the caller) is killed before its namespace
goes.

Not a pytest module: tests/test_four_hosts.py, tests/test_multihost.py and
bench/bench_multihost.py use it (it needs root and iproute2; `unavailable()` says why not, for a
skip).
"""

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess

import psutil

from conftest import apt_install


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable():
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        apt = apt_install("iproute2")
        if apt.returncode != 0 or shutil.which("ip") is None:
            return f"iproute2 is missing and could not be installed: {apt.stderr[-300:]}"
    return None


def _free_subnet():
    """A 10.214.X.0/24 no address or route of this machine is in (X from this pid first)."""
    for k in range(250):
        subnet = f"10.214.{(os.getpid() + k) % 250 + 1}"
        if not ip("-o", "addr", "show", "to", f"{subnet}.0/24").stdout.strip() and \
                not ip("route", "show", f"{subnet}.0/24").stdout.strip():
            return subnet
    raise RuntimeError("no free 10.214.X.0/24 subnet for the simulated hosts")


@dataclasses.dataclass
class Host:
    address: str
    netns: str | None   # None: the root namespace
    iface: str          # the interface its ranks' Gloo uses (the bridge, or its veth end)

    @property
    def prefix(self):
        """A command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def netns_id(self):
        """What /proc/self/ns/net reads for a process on this host."""
        if self.netns is None:
            return os.readlink("/proc/self/ns/net")
        return f"net:[{os.stat(f'/run/netns/{self.netns}').st_ino}]"


def _end_processes_in(netns):
    """Kill what still runs in `netns` (the caller's executors and Python workers) and wait."""
    pids = [int(p) for p in ip("netns", "pids", netns, check=False).stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    left = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            left.append(psutil.Process(pid))
    psutil.wait_procs(left, timeout=10)


@contextlib.contextmanager
def simulated_hosts(n):
    """`n` Hosts: the root namespace on a new bridge, and n - 1 namespaces on it."""
    tag = str(os.getpid())
    subnet = _free_subnet()
    bridge = f"hvb{tag}"
    made_bridge, spaces, veths = False, [], []
    try:
        ip("link", "add", bridge, "type", "bridge")
        made_bridge = True
        ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        hosts = [Host(f"{subnet}.1", None, bridge)]
        for i in range(1, n):
            name, here, there = f"hvns{tag}x{i}", f"hvr{tag}x{i}", f"hvn{tag}x{i}"
            ip("netns", "add", name)
            spaces.append(name)
            ip("link", "add", here, "type", "veth", "peer", "name", there)
            veths.append(here)
            ip("link", "set", there, "netns", name)
            ip("link", "set", here, "master", bridge)
            ip("link", "set", here, "up")
            ip("-n", name, "addr", "add", f"{subnet}.{i + 1}/24", "dev", there)
            ip("-n", name, "link", "set", there, "up")
            ip("-n", name, "link", "set", "lo", "up")  # PySpark's workers talk to their daemon on it
            hosts.append(Host(f"{subnet}.{i + 1}", name, there))
        yield hosts
    finally:
        for name in spaces:
            _end_processes_in(name)
        for here in veths:
            ip("link", "del", here, check=False)
        if made_bridge:
            ip("link", "del", bridge, check=False)
        for name in spaces:
            ip("netns", "del", name, check=False)
