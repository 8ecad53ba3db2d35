"""A rank's own sockets, as an elastic rank leaves a group whose peers are gone
(`hvd_magic.rank.elastic_world`): which of them its group made (`GroupSockets`), and shutting
those down, so that what waits on them returns an error at once instead of after the group's
timeout. The code's own connections (an MLflow client, a database, a data stream) stay open.

Not for: when to cut (the driver's word, `elastic_world.World`).
"""

import contextlib
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


class GroupSockets:
    """The sockets this rank's groups made, by descriptor and identity (its inode: a descriptor
    closed and reused by the code's own socket is not the group's any more).

    A group's sockets are those opened while its framework made them (`making`: in
    `World.form`, the store's connection and ``init_process_group``, where Gloo connects every
    pair; Horovod's ``hvd.init()``, which returns once its Gloo contexts are connected).
    Telling them apart by their peers' addresses would not do: on one machine every member and
    the code's own server are all 127.0.0.1, and Gloo's ports are its own. A socket the code
    opens (or accepts) on another thread while a group is being made counts as the group's:
    said in docs/elastic.md."""

    def __init__(self):
        self._made = {}       # fd -> identity, of every group made (closed ones dropped)
        self._before = None   # the descriptors open when the making now going on began

    @contextlib.contextmanager
    def making(self):
        """What opens inside the ``with`` is the group's."""
        self._before = opened()
        try:
            yield
        finally:
            before, self._before = self._before, None
            made = {fd: identity(fd) for fd in opened() - before}
            self._made = self.held({**self._made, **made})

    def current(self):
        """{fd: identity} of the groups' sockets open now, with those of a making going on."""
        held = self.held(self._made)
        before = self._before
        if before is not None:
            held.update((fd, identity(fd)) for fd in opened() - before)
        return held

    @staticmethod
    def held(sockets):
        """Those of `sockets` ({fd: identity}) that are still what they were."""
        return {fd: what for fd, what in sockets.items() if what and identity(fd) == what}

    def cut(self, sockets=None):
        """Shut down the groups' connected sockets (or those of `sockets`, {fd: identity}, that
        are still what they were)."""
        cut(self.current() if sockets is None else self.held(sockets))


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
