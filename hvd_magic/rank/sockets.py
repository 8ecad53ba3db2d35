"""A rank's own sockets, as an elastic rank leaves a group whose peers are gone
(`hvd_magic.rank.elastic_world`): which it has open, and shutting down those a group opened, so
that what waits on them returns an error at once instead of after the group's timeout.

Not for: when to cut (the driver's word, `elastic_world.World`).
"""

import os
import socket
import sys

from ..compat import torch as torch_compat

_TCP = (socket.AF_INET, socket.AF_INET6)


def opened():
    """This process's open socket descriptors."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(int(name))
        except OSError:  # (the listing's own descriptor, or one closed meanwhile)
            pass
    return found


def identity(fd):
    """What descriptor `fd` is now (``socket:[inode]``), or None."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def cut(fds):
    """Shut down the connected TCP sockets among `fds` (a listener is left alone: shutting
    Gloo's aborts the process). NCCL's transport is not sockets: its group is aborted."""
    _abort_nccl()
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # closed meanwhile
            continue
        try:
            if sock.family in _TCP and sock.type == socket.SOCK_STREAM and not \
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays its owner's


def reserve():
    """A free port, kept bound (not listening) so that no one else takes it."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("", 0))
    return held


def _abort_nccl():
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_initialized() and dist.get_backend() == "nccl":
            torch_compat.abort_default_group()
    except RuntimeError:  # (already gone)
        pass
