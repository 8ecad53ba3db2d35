"""JAX's waits for its peers, told to the hang watchdog and the stacks (`hvd_magic.rank.stall`).

Where a JAX rank waits for the other processes:

- ``jax.distributed.initialize``: every process must call it (a wait the watchdog treats as
  torch's ``init_process_group``);
- ``jax.experimental.multihost_utils``' collectives (`MULTIHOST_WAITS`), named by function;
- a call of a ``jax.jit`` or ``jax.pmap`` function, named ``jit(<its function>)``: on CPU, XLA
  runs a computation that holds a collective inside the call (measured here, jax 0.10.2: the
  call took the 2 s a peer slept, its ``block_until_ready`` nothing). The jitted function is
  JAX's C++ object, whose call cannot be replaced: ``jax.jit`` hands the cell a thin wrapper
  around it (every attribute, ``lower`` and ``trace`` included, is the jitted function's);
- on GPU the call returns at once and the wait is in ``block_until_ready`` (a jax.Array's or
  ``jax.block_until_ready``) or where the value is read back (``np.asarray``, ``float``,
  ``print``): both wrapped on JAX's array class (`hvd_magic.compat.jax`; where a JAX keeps it
  elsewhere one line says so).

Each rank counts the waits it began (a wait inside another is the outer one's), and its stacks
say the count and the newest (`jax_collectives`): ranks of one SPMD program begin the same ones,
so a rank behind the others is one whose count is lower. Nothing here imports JAX: each module
is patched right after the cell imports it.
"""

import functools

from . import hooks, stall
from ..compat import jax as jax_compat

MULTIHOST_WAITS = ("process_allgather", "broadcast_one_to_all", "sync_global_devices",
                   "assert_equal", "reached_preemption_sync_point")
TO_HOST = "jax.Array to host"  # (an array's value read: np.asarray, float, print)
BY = "hvd_magic's count of JAX's waits"

_count = {"seq": 0, "op": None}  # the waits this rank began, and the newest


def _began(op):
    _count["seq"] += 1
    _count["op"] = op


def jax_collectives():
    """Where this rank is in JAX's waits, for its stacks: [{"group": "jax", "seq", "op", "by"}];
    [] before the first."""
    if not _count["seq"]:
        return []
    return [{"group": "jax", "seq": _count["seq"], "op": _count["op"], "by": BY}]


class Waited:
    """A ``jax.jit`` (or ``pmap``) function whose calls are waits named `op`; everything else is
    the jitted function's own."""

    def __init__(self, jitted, op):
        self.__wrapped__ = jitted
        self._call = stall._blocking(jitted, op, began=_began)
        functools.update_wrapper(self, jitted, updated=())

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)

    def __get__(self, instance, owner=None):  # (a jitted method, as JAX's own binds)
        return self if instance is None else functools.partial(self, instance)

    def __repr__(self):
        return repr(self.__wrapped__)


def _transform(transform, kind):
    """`transform` (``jax.jit``, ``jax.pmap``) whose functions' calls are waits."""
    @functools.wraps(transform)
    def waited(*args, **kwargs):
        made = transform(*args, **kwargs)
        fun = args[0] if args else kwargs.get("fun")
        if fun is None:  # (called without the function: a decorator that takes it)
            return lambda f: Waited(made(f), f"{kind}({getattr(f, '__name__', '?')})")
        return Waited(made, f"{kind}({getattr(fun, '__name__', '?')})")
    waited._hvd_magic_wait = True
    return waited


def _patch_jax(jax):
    import jax.distributed
    for module, name, op, hold in ((jax.distributed, "initialize", "jax.distributed.initialize",
                                    True), (jax, "block_until_ready", "block_until_ready", False)):
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, "_hvd_magic_wait", False):
            setattr(module, name, stall._blocking(fn, op, hold, _began))
            getattr(module, name)._hvd_magic_wait = True
    for kind in ("jit", "pmap"):
        fn = getattr(jax, kind, None)
        if fn is not None and not getattr(fn, "_hvd_magic_wait", False):
            setattr(jax, kind, _transform(fn, kind))
    # (a computation already dispatched: holding it back for a peer in pdb is too late)
    jax_compat.wrap_array_waits(lambda fn, what: stall._blocking(
        fn, TO_HOST if what == "value" else what, False, _began))
    stall._start_monitor()


def _patch_multihost(module):
    stall._wrap(module, MULTIHOST_WAITS, began=_began)


def install():
    """Wrap JAX's waits once the cell imports JAX (nothing imported here)."""
    hooks.when_imported("jax", _patch_jax)
    hooks.when_imported("jax.experimental.multihost_utils", _patch_multihost)
