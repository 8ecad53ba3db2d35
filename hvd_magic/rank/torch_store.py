"""torch.distributed's store on a rank: where each new default group finds it, and how long
rank 0 keeps it at the end.

Rank 0's ``init_process_group`` hosts the store, on ``MASTER_PORT`` (`hvd_magic.frameworks.torch`
holds two ports for it, named in ``HVD_MAGIC_TORCH_PORTS``). `install` makes a destroy of the
default group move ``MASTER_PORT`` to the other port: in a cell that destroys its group and
makes it again, a rank that gets there first must not find rank 0's old store, still up until
rank 0 destroys its own group. There it would read the old group's keys (the same names: torch
numbers groups from 0 again) and connect its Gloo to addresses that are gone, while rank 0's
new store waits for it. On the other port it waits until rank 0's new store listens (torch's
client retries). A ``MASTER_PORT`` the cell set itself is left as it is. And a rank other than
0 that starts its group before rank 0's store listens waits for it with probes (`_wait_for_store`)
rather than in torch's client, whose retries come after a back-off of up to 0.7 s.

Not for: the variables themselves (`hvd_magic.frameworks.torch`), or anything before the cell
imports torch (`hooks.when_imported`).
"""

import functools
import os
import socket
import sys
import time

from . import gpus, hooks
from ..compat import torch as torch_compat

PORTS = "HVD_MAGIC_TORCH_PORTS"  # the two store ports a rank's groups take in turn


def _next_port():
    """The port the next default group's store takes, or None where the cell set its own."""
    ports = os.environ.get(PORTS, "").split(",")
    current = os.environ.get("MASTER_PORT")
    if len(ports) != 2 or current not in ports:
        return None
    return ports[1 - ports.index(current)]


def _wait_for_store(args, kwargs, most=60.0):
    """On a rank other than 0, before an ``env://`` group's start: wait until rank 0's store
    accepts on our ``MASTER_PORT``. torch's client, refused, retries only after 0.3-0.7 s (seen
    with torch 2.13: a client 50 ms early connected at 0.69 s), which a rank that reaches
    ``init_process_group`` first would pay on every launch. A probe that connects and closes is
    nothing to the store (it counts its clients by their first request). After `most` seconds
    torch's own wait goes on."""
    method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    if method not in (None, "env://") or kwargs.get("store") is not None or len(args) > 5 or \
            os.environ.get("RANK", "0") == "0" or kwargs.get("rank") == 0 or \
            os.environ.get("MASTER_PORT") not in os.environ.get(PORTS, "").split(","):
        return
    probe((os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])), most)


def probe(address, most, gone=lambda: False):
    """Wait until `address` accepts a connection (at most `most` seconds, or until `gone()`)."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline and not gone():
        try:
            socket.create_connection(address, timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.01)


_MADE_BY_THE_WORLD = ("backend", "init_method", "world_size", "rank", "store")


_joined = None  # an elastic torch rank's `World` (rank/elastic_world.py), once it joined


def hand_first_group_to(world):
    """The code's first ``env://`` default group is `world`'s to make (an elastic torch rank)."""
    global _joined
    _joined = world


def _elastic_first(args, kwargs):
    """An elastic torch run's rank whose code makes its first default group (``env://``):
    its `World`, which makes that group from the world it joined; else None."""
    method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    if _joined is None or not _joined.first_pending() or method not in (None, "env://") or \
            kwargs.get("store") is not None or len(args) > 2:
        return None
    return _joined


def _patch(c10d):
    init, destroy = c10d.init_process_group, c10d.destroy_process_group

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        gpus.refuse_shared_nccl(args, kwargs)  # (before the store: a refused rank waits for none)
        here = _elastic_first(args, kwargs)
        if here is not None:  # the group of the elastic world the rank joined (or a newer one)
            options = {k: v for k, v in kwargs.items() if k not in _MADE_BY_THE_WORLD}
            return here.first_group(kwargs.get("backend", args[0] if args else None), options)
        _wait_for_store(args, kwargs)
        return init(*args, **kwargs)

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        world = group is None or group is c10d.GroupMember.WORLD
        destroy(group)
        port = _next_port() if world else None
        if port is not None:
            os.environ["MASTER_PORT"] = port

    hooks.replace(c10d, {"init_process_group": init_process_group,
                         "destroy_process_group": destroy_process_group})


def install():
    hooks.when_imported("torch.distributed.distributed_c10d", _patch)


def release(timeout=30.0):
    """Keep torch.distributed's group and store alive until every rank is done with them.

    A cell that ends without a collective after making its group (``dist.get_world_size()`` as
    its value) lets a rank exit while a slower peer is still in its own
    ``init_process_group``: that peer reads rank 0's store, and finishes Gloo's full mesh over
    the pairs with every other rank. An exit there is "Connection reset by peer" in the store,
    or "Gloo connectFullMesh failed ... Connection closed by peer". So each rank says it is
    done on the store and waits until all have (at most `timeout` s; a rank that failed is
    stopped by the driver, its peers with it). Rank 0, whose store it is, leaves last: once
    every other rank has said it read the count. A group the cell destroyed, or torch never
    loaded, costs nothing."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        store = torch_compat.default_store()
        if store is None:
            return
        size, deadline = dist.get_world_size(), time.monotonic() + timeout
        _count_up(store, "hvd_magic/ranks_done", size, deadline)
        if dist.get_rank() == 0:
            _count_up(store, "hvd_magic/ranks_left", size, deadline)
        else:
            store.add("hvd_magic/ranks_left", 1)  # (its last word to the store)
    except Exception:  # a peer already gone: nothing left to wait for
        pass


def _count_up(store, key, size, deadline):
    """Add one to `key`, then wait until `size` ranks have."""
    count = store.add(key, 1)
    while count < size and time.monotonic() < deadline:
        time.sleep(0.02)
        count = store.add(key, 0)
