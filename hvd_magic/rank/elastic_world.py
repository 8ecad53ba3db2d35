"""Who this rank trains with, in an elastic torch.distributed run (``--min-np`` on a cell that
uses `hvd_magic.elastic`, not Horovod): the rank's side of the driver's membership
(`hvd_magic.launch.elastic.ddp`).

The driver numbers each world it forms (a generation) and tells every member twice, through the
rank's task and its probe pipe (`hvd_magic.rank.stacks` hands the messages here, on the thread
that reads the pipe, never behind a stack snapshot):

- ``lost``: a member of the run was lost. The connected TCP sockets this rank's process group
  made (its store's and Gloo's: `sockets.GroupSockets`, never the code's own) are shut down at
  once, so that a collective waiting on a peer that is gone (or on a survivor that has already
  left the group) returns with an error instead of waiting for Gloo's timeout. Gloo's listener
  is left alone (shutting it aborts the process). While this rank forms a new group nothing is
  cut: the ``reform`` that follows a loss does it (a ``lost`` heard late must not cut the newer
  world's store);
- ``reform``: generation `g` will be these slots, in rank order. After a loss the survivors are
  already waiting for it; when a rank joins, the others leave at their next ``commit()``; a
  rank forming an older world leaves it at once (its sockets cut);
- ``world``: where generation `g`'s store is, once its rank 0 (the first slot) has made it and
  said where (an ``elastic`` event with ``what: store``);
- ``leave``: the run goes on without this rank (it exits).

`join` (the rank's start, before the user's code) waits for the first generation that has this
slot and sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``... The code's own
``dist.init_process_group("gloo")`` (``env://``) comes to `first_group` (`torch_store`), which
makes that world's group as `form` makes every later one (`hvd_magic.elastic.run`, after a
change): from the world's store, connected to in short tries, following a newer world heard
meanwhile; once every member came to the store (`_all_came`), the group's connections are made
in tries of `CONNECT_TIMEOUT`, and its collectives then wait as long as the code asked. A rank
whose group could not be made (a member lost meanwhile) says ``failed``, and the driver forms the
same members again on a new store. Every wait on the driver or on the members (`wait_limit`:
the elastic timeout and `GRACE`, the driver deciding first) ends with a `TimeoutError` that
names whom it waited for.

A rank of Horovod's elastic run gets a `horovod_ring.Ring` instead: ``lost`` alone.

Not for: the state rolled back and shared (`hvd_magic.elastic`), or deciding anything (the
driver decides).
"""

import json
import os
import sys
import threading
import time
from datetime import timedelta

from . import horovod_ring, reporting, sockets
from ..compat import torch as torch_compat
from .torch_store import PORTS, hand_first_group_to, probe

ELASTIC = "HVD_MAGIC_ELASTIC"             # "torch" in such a run's ranks
SLOT = "HVD_MAGIC_ELASTIC_SLOT"           # this process's slot (the view's row)
ADDRESS = "HVD_MAGIC_ELASTIC_ADDR"        # this machine's address, as the other ranks reach it
STORE_TIMEOUT = 60.0                      # seconds a member waits for a new group's store
STORE_TRY = 2.0                           # ...in tries this long, a newer world heard between
CONNECT_TIMEOUT = timedelta(seconds=5)    # a try at a group's connections (Gloo makes 5), once
                                          # all its members came
ARRIVED = "hvd_magic/came"                # a store's keys: which members came to it
WAIT = "HVD_MAGIC_ELASTIC_WAIT"           # the run's elastic timeout, in seconds
DEFAULT_WAIT = 600.0                      # ...where none is set (Horovod's default)
GRACE = 60.0                              # a rank's waits last this much longer: the driver,
                                          # which ends the run at the elastic timeout, speaks first


def active():
    return os.environ.get(ELASTIC) == "torch"


def horovod_elastic():
    """A rank of Horovod's elastic run (`horovod_ring`)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


class World:
    """This rank's latest word from the driver, and the group it is in now."""

    def __init__(self, slot):
        self.slot = slot
        self.generation = None   # the generation this rank's group belongs to
        self.reform = None       # the latest ``reform`` heard
        self.stores = {}         # generation -> its ``world`` message (where its store is)
        self.disrupted = False   # a member of this rank's group was lost since it formed
        self.ended = False       # the driver told this rank it is not in the run any more
        self._failed = -1        # the newest generation whose forming failed here
        self._forming = None     # the generation this rank is forming now
        self._joined = None      # the world `join` found, its group not made yet
        self._options = {}       # the code's init_process_group arguments (timeout...)
        self._changed = threading.Condition()
        self.sockets = sockets.GroupSockets()  # what this rank's groups made: a loss cuts them
        self.wait_limit = float(os.environ.get(WAIT) or DEFAULT_WAIT) + GRACE

    # -- the helper thread ----------------------------------------------------------------------
    def heard(self, message):
        with self._changed:
            kind, g = message.get("t"), message.get("g")
            if kind == "reform" and (self.reform is None or g > self.reform["g"]):
                self.reform = message
                if self._forming is not None and g > self._forming:
                    self._cut()  # the world this rank is forming is gone: leave its wait
            elif kind == "world":
                self.stores[g] = message
            elif kind in ("lost", "leave"):
                self.disrupted = True
                self.ended = self.ended or kind == "leave"
                if self._forming is None or self.ended:  # (while forming: the reform after it)
                    self._cut()
            self._changed.notify_all()

    def _cut(self):
        """Shut down the connected TCP sockets this rank's groups made (and those the group
        being made has opened so far): what it waits on returns an error now."""
        self.sockets.cut()

    # -- the rank's own thread ------------------------------------------------------------------
    def changed(self):
        """The driver formed (or is forming) a world with this rank that its group is not."""
        reform = self.reform
        return self.ended or (reform is not None and reform["g"] != self.generation
                              and reform["g"] > self._failed and self.slot in reform["slots"])

    def troubled(self, timeout):
        """Whether the driver said (or says within `timeout` seconds) that this rank's group
        lost a member or that a new world is formed."""
        with self._changed:
            return self._changed.wait_for(lambda: self.disrupted or self.changed(), timeout)

    def _next(self):
        """The newest ``reform`` this rank is in and its group is not, waited for."""
        with self._changed:
            if not self._changed.wait_for(self.changed, self.wait_limit):
                raise TimeoutError(
                    f"hvd_magic: the elastic driver put slot {self.slot} in no world for "
                    f"{self.wait_limit:g} s (the elastic timeout, and {GRACE:g} s more)")
            if self.ended:
                raise SystemExit("hvd_magic: the elastic run ended without this rank")
            return self.reform

    def _store_of(self, g):
        """Generation `g`'s ``world`` message, or None once a newer ``reform`` came first."""
        with self._changed:
            if not self._changed.wait_for(lambda: g in self.stores or self.ended
                                          or self.reform["g"] != g, self.wait_limit):
                raise TimeoutError(
                    f"hvd_magic: world {g}'s rank 0 (slot {self.reform['slots'][0]}) did not "
                    f"make its store within {self.wait_limit:g} s (the elastic timeout, and "
                    f"{GRACE:g} s more)")
            return self.stores.get(g) if not self.ended and self.reform["g"] == g else None

    def _formed(self, g):
        """Generation `g`'s group is made."""
        self.generation, self.disrupted, self._forming = g, False, None

    def join(self, announce=True):
        """The first world with this slot (`announce`: tell the driver this rank is here); its
        variables set for ``init_process_group``, whose group `first_group` makes."""
        if announce:
            reporting.send({"t": "elastic", "what": "join"})
        reporting.send({"t": "blocked", "op": "init", "seconds": 0})
        while True:
            reform = self._next()
            rank = reform["slots"].index(self.slot)
            if rank == 0:  # our store port: free, announced, and taken by the group's store
                self.held = sockets.reserve()  # (bound, not listening: no one else takes it)
                _announce(reform["g"], self.held.getsockname()[1])
            world = self._store_of(reform["g"])
            if world is not None:
                break
        self._formed(reform["g"])
        self._forming, self._joined = reform["g"], reform  # (the group is the code's to make)
        hand_first_group_to(self)
        _set_env(rank, len(reform["slots"]), world)
        reporting.send({"t": "unblocked"})
        return rank

    def first_group(self, backend, options):
        """The code's own first ``init_process_group`` (``env://``): the group of the world
        `join` found, made as `form` makes every later one (a newer world heard meanwhile, or a
        member lost, is followed to the newest world). `options`: the call's other arguments
        (``timeout``...), kept for the later groups too."""
        self._options = options
        first, self._joined = self._joined, None
        with self._changed:
            stale = self.changed()
        self.form(backend, None if stale else first)

    def refresh(self):
        """A warm session's rank, before a cell: into the newest world, if there is one (the
        group re-formed where the cells made one, else the variables set for the next)."""
        if not self.changed():
            return
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_initialized():
            self.form(dist.get_backend())
        else:
            self.join(announce=False)

    def first_pending(self):
        """Whether `join` found a world whose group the code has not made yet."""
        return self._joined is not None

    def form(self, backend, reform=None):
        """Leave the current group and make the newest world's (or `reform`'s, the world
        `join` found): its rank for this process."""
        import torch.distributed as dist

        since = time.monotonic()
        while True:
            if reform is None:
                reform = self._next()
                if dist.is_initialized():
                    try:
                        dist.destroy_process_group()
                    except Exception:  # noqa: BLE001  (a broken group: what is left goes with it)
                        pass
            g = reform["g"]
            self._forming = g
            rank, size = reform["slots"].index(self.slot), len(reform["slots"])
            port = self.held.getsockname()[1] if g == self.generation and rank == 0 else 0
            # (a wait for every member: a frozen one is given up by the driver, driver/frozen.py)
            reporting.send({"t": "blocked", "op": "init_process_group",
                            "seconds": time.monotonic() - since})
            try:  # (what the store's and the group's making open is the group's: a loss cuts it)
                with self.sockets.making():
                    store = self._store(reform, rank, size, port)
                if store is not None and self._all_came(store, reform, rank, backend):
                    _fresh_group_names(dist)
                    wait = _timeout(self._options, backend)
                    short = torch_compat.can_set_group_timeout()
                    with self.sockets.making():  # (the prefix torch gives an env:// group's store)
                        dist.init_process_group(
                            backend, store=dist.PrefixStore("default_pg", store), rank=rank,
                            world_size=size,
                            **dict(self._options, timeout=CONNECT_TIMEOUT if short else wait))
                    if short:  # (then its collectives wait as long as the code asked, or torch's)
                        torch_compat.set_group_timeout(wait)
                    self._formed(g)
                    reporting.send({"t": "unblocked"})
                    return rank
            except Exception:  # noqa: BLE001  (a member lost while it formed)
                reporting.send({"t": "unblocked"})
                if not self.disrupted and not self.changed():
                    raise
                self._failed = g  # a newer world is needed: the driver forms it
                reporting.send({"t": "elastic", "what": "failed", "g": g})
            reform = None

    def _all_came(self, store, reform, rank, backend):
        """Whether every member of world `reform` came to its store (False: a newer world
        came first). Waited for here, in short tries that follow a newer world, and not inside
        the group's making: Gloo, once it has a peer's address, waits for that peer's
        connection for the group's timeout five times over (its retries: 2.5 hours by
        default), and a member lost just then (the second of two slots killed a moment apart)
        would hold the others there with nothing to cut. Once all came, the group is made at
        once, in tries of `CONNECT_TIMEOUT`. A member that never comes (alive but frozen: the
        driver ends it, `hvd_magic.driver.frozen`) is waited for at most the group's timeout
        or `wait_limit`, whichever is shorter, and named."""
        g, size = reform["g"], len(reform["slots"])
        store.set(f"{ARRIVED}/{rank}", "1")
        came = [f"{ARRIVED}/{r}" for r in range(size)]
        limit = min(_timeout(self._options, backend).total_seconds(), self.wait_limit)
        deadline = time.monotonic() + limit
        while True:
            try:
                store.wait(came, timedelta(seconds=STORE_TRY))
                return True
            except Exception:  # noqa: BLE001  (not all yet, or the store is gone)
                with self._changed:
                    if self._changed.wait_for(lambda: self.reform["g"] != g or self.ended,
                                              STORE_TRY / 10):
                        return False
                if time.monotonic() > deadline:
                    missing = [s for r, s in enumerate(reform["slots"])
                               if not store.check([came[r]])]
                    raise TimeoutError(
                        f"hvd_magic: world {g}'s members in slots {missing} did not come to "
                        f"its store within {limit:g} s") from None

    def _store(self, reform, rank, size, port=0):
        """The store of world `reform` (rank 0 makes it: on `port`, already announced, or on a
        free port it announces), or None once a newer world is heard."""
        import torch.distributed as dist

        g, wait = reform["g"], timedelta(seconds=STORE_TIMEOUT)
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", port, size, is_master=True, timeout=wait,
                                  wait_for_workers=False)
            if not port:
                _announce(g, store.port)
        world = self._store_of(g)
        if world is None:
            return None
        _set_env(rank, size, world)
        if rank == 0:
            return store
        # Connected to in short tries: a store whose maker left it for a newer world is never
        # listened on again, and torch's client would retry it for the whole timeout (a
        # connection refused is retried, and there is no socket yet for `_cut` to shut).
        deadline, address = time.monotonic() + STORE_TIMEOUT, (world["addr"], int(world["port"]))
        while True:
            probe(address, STORE_TRY, lambda: self.reform["g"] != g or self.ended)
            try:
                client = dist.TCPStore(*address, size, is_master=False,
                                       timeout=timedelta(seconds=STORE_TRY))
            except Exception:  # noqa: BLE001  (refused, or no answer within the try)
                if self.reform["g"] != g or self.ended:
                    return None  # a newer world came: its store, not this one
                if time.monotonic() > deadline:
                    raise
                continue
            client.set_timeout(wait)  # (the group's own waits: the whole timeout)
            return client


def _fresh_group_names(dist):
    """torch names an unnamed group by a count of the groups made (their keys in the store are
    under that name), set back to 0 when the default group is destroyed. A group whose making
    failed counted too: set back here, or this rank's next group is named otherwise than its
    peers' and their Gloo waits for keys that never come."""
    if not dist.is_initialized():
        torch_compat.restart_group_names()


def _timeout(options, backend):
    """The group's timeout: the code's own (``init_process_group(timeout=...)``) or torch's."""
    return options.get("timeout") or torch_compat.default_timeout(backend)


def _announce(g, port):
    reporting.send({"t": "elastic", "what": "store", "g": g, "port": port,
                    "addr": os.environ.get(ADDRESS, "127.0.0.1")})


def _set_env(rank, size, world):
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(size), "GROUP_RANK": str(rank),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(size),
        "MASTER_ADDR": str(world["addr"]), "MASTER_PORT": str(world["port"]),
        "TORCHELASTIC_RESTART_COUNT": str(world["g"]),
        # (rank/torch_store.py: a rank other than 0 probes for the store before torch's client)
        PORTS: f"{world['port']},{world['port']}",
    })


_world = None


def world():
    """This rank's `World` (None outside an elastic run): made at the rank's start, before the
    code opens any socket."""
    global _world
    if _world is None and active():
        _world = World(int(os.environ.get(SLOT, "0")))
    elif _world is None and horovod_elastic():
        _world = horovod_ring.Ring()
        _world.install()
    return _world


def heard(line):
    """A JSON line from the probe pipe (`hvd_magic.rank.stacks`), for the `World` the rank made
    at its start (a warm session's rank makes none: its ring is reset between cells)."""
    if _world is not None:
        _world.heard(json.loads(line))

